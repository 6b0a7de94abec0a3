"""Defaults that the daemon, the trigger, the web app and the loaders must share.

Each is defined once here: a second copy that drifts (say, a web app guarding a different
trace root than the daemon writes to) would be a silent disagreement between two processes.
"""

from __future__ import annotations

# TCP port of the RPC server: dynolog's default, so ``dyno`` and ``kscope trace`` both find it
# (docs/protocol.md §3).
DEFAULT_PORT = 1778

# Where the daemon lets Kineto write trace files unless told otherwise (``--trace-root``).
DEFAULT_TRACE_ROOT = "/tmp/kinetoscope/traces"

# File-name endings of trace files that ``kscope analyze`` and the web app read.
TRACE_SUFFIXES = (".json", ".json.gz")

__all__ = ["DEFAULT_PORT", "DEFAULT_TRACE_ROOT", "TRACE_SUFFIXES"]
