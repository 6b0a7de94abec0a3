"""``kscope daemon --catalog URL``: the daemon announces itself to the autopilot's catalog.

Every ``interval_s`` (and at start) it upserts its row of ``fleet_hosts`` (address, host name,
GPU count, version, heartbeat) with :meth:`kinetoscope.store.fleet.FleetStore.announce`;
``kscope autopilot --announced`` then watches every daemon whose heartbeat is recent. A catalog
that cannot be reached is logged (rate-limited) and retried at the next beat: announcing is
secondary, it never stops the daemon. SQLAlchemy loads only when ``--catalog`` is given.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kinetoscope.daemon.logsetup import RateLimitedLogger

log = logging.getLogger("kinetoscope.daemon")


class CatalogAnnouncer:
    """A thread that heartbeats this daemon into the catalog's ``fleet_hosts``."""

    def __init__(
        self,
        catalog_url: str,
        address: Callable[[], str],
        hostname: str,
        devices: Callable[[], int | None],
        version: str,
        interval_s: float = 30.0,
    ) -> None:
        self.catalog_url = catalog_url
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
        from kinetoscope.store.catalog import Catalog
        from kinetoscope.store.fleet import FleetStore

        try:
            with Catalog.open(self.catalog_url) as cat:
                FleetStore(cat).announce(self._address(), self.hostname, self._devices(), self.version)
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
