"""``kscope daemon --catalog URL``: the daemon announces itself, every ``interval_s``.

Every ``interval_s`` (and at start) a thread hands a ``protocol.announce.HostAnnouncement``
(address, host name, GPU count, version) to the ``AnnounceSink`` it was given; the CLI plugs in
the autopilot's catalog (``store.fleet.catalog_sink``, which upserts the daemon's row of
``fleet_hosts``), and ``kscope autopilot --announced`` then watches every daemon whose heartbeat
is recent. The daemon never imports the store (an import-linter contract). A heartbeat that
cannot be delivered is logged (rate-limited) and retried at the next beat: announcing is
secondary, it never stops the daemon.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kinetoscope.daemon.logsetup import RateLimitedLogger
from kinetoscope.protocol.announce import AnnounceSink, HostAnnouncement

log = logging.getLogger("kinetoscope.daemon")


class Announcer:
    """A thread that heartbeats this daemon into ``sink`` (module docstring)."""

    def __init__(
        self,
        sink: AnnounceSink,
        address: Callable[[], str],
        hostname: str,
        devices: Callable[[], int | None],
        version: str,
        interval_s: float = 30.0,
    ) -> None:
        self.sink = sink
        self._address = address
        self.hostname = hostname
        self._devices = devices
        self.version = version
        self.interval_s = interval_s
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kscope-announce", daemon=True)
        self._rl = RateLimitedLogger(log, burst=3)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def announce_once(self) -> bool:
        from kinetoscope.errors import KinetoscopeError

        beat = HostAnnouncement(self._address(), self.hostname, self._devices(), self.version)
        try:
            self.sink(beat)
        except (KinetoscopeError, OSError) as exc:
            self._rl.warning(
                "announce",
                "cannot announce this daemon to the catalog: %s (retrying every %g s)",
                exc,
                self.interval_s,
            )
            return False
        self.beats += 1
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self.announce_once()
            self._stop.wait(self.interval_s)
