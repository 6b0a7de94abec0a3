"""The daemon-selection flags every command that asks daemons shares: ``--host``, ``--hosts-file``.

Use in a command (see trace_cmd.py)::

    host: list[str] | None = DAEMON_HOSTS, hosts_file: str | None = HOSTS_FILE,
    ...
    hosts = daemon_hosts(host, hosts_file)

One definition, so ``kscope trace`` and ``kscope stacks`` select daemons the same way.
"""

from __future__ import annotations

import typer

from kinetoscope.collect.client import read_hosts_file
from kinetoscope.errors import UsageError
from kinetoscope.protocol.defaults import DEFAULT_PORT

DAEMON_HOSTS = typer.Option(
    None,
    "--host",
    "-H",
    metavar="HOST[:PORT]",
    help=f"Daemon to ask (repeatable or comma-separated; default localhost:{DEFAULT_PORT}).",
)
HOSTS_FILE = typer.Option(
    None,
    "--hosts-file",
    metavar="FILE",
    help="Daemons to ask, one HOST[:PORT] per line (# comments); merged with --host.",
)


def daemon_hosts(host: list[str] | None, hosts_file: str | None) -> list[str] | None:
    """``--host`` values and the hosts of ``--hosts-file`` together (None: neither given)."""
    if hosts_file is None:
        return host
    listed = read_hosts_file(hosts_file)
    if not listed:
        raise UsageError(f"hosts file {hosts_file}: no host listed (one HOST[:PORT] per line)")
    return [*(host or []), *listed]
