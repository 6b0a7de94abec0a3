"""A daemon's heartbeat, and the interface the daemon announces itself through.

``kscope daemon --catalog URL`` announces itself (address, host name, GPUs, version) every
``announce_interval_s`` so that ``kscope autopilot --announced`` can find it. The daemon does not
know where the heartbeat goes: it calls an ``AnnounceSink`` with a ``HostAnnouncement``, and the
command that starts it plugs one in (``cli/daemon_cmd.py`` plugs the catalog in:
``store.fleet.catalog_sink``). Why an interface here: the daemon and the store are independent
packages (an import-linter contract in pyproject.toml), and both depend on this definition.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from kinetoscope.protocol.structinfo import prime_structs


class HostAnnouncement(msgspec.Struct, frozen=True):
    """One heartbeat: where the daemon answers RPC (``host:port``, ``[v6]:port``), its host name,
    its GPU count (None: unknown, no NVML) and the kscope version it runs."""

    address: str
    hostname: str
    devices: int | None
    version: str


class AnnounceSink(Protocol):
    """Receives a daemon's heartbeats. Raise ``KinetoscopeError`` or ``OSError`` when the
    heartbeat could not be delivered: the daemon logs it (rate-limited) and tries again at the
    next beat; announcing never stops the daemon."""

    def __call__(self, beat: HostAnnouncement) -> None: ...


prime_structs(globals())
