"""Keeping a job's lease while its sample runs.

A lease (``fleet_jobs.lease_owner`` until ``lease_expires``, docs/autopilot.md "Crash safety and
leases") lets another autopilot instance take over a job whose owner died. A sample can run
longer than ``lease_s`` (a slow job's iterations, a long analysis); without renewal a healthy
instance would lose its job mid-sample and a second instance would trace and analyse it again.
:class:`LeaseKeeper` renews the lease every third of its length until the sample finishes, so
only an instance that stopped renewing (killed, or cut off from the catalog) loses it.
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from typing import Protocol

log = logging.getLogger("kinetoscope.autopilot")


class _Renews(Protocol):
    def renew_lease(self, job_key: str, owner: str, lease_s: float) -> bool: ...


class LeaseKeeper:
    """Context manager: renews ``owner``'s lease on ``job_key`` in a background thread.

    ``renewals`` counts successful renewals; ``lost`` is set once the catalog says another
    instance holds the lease (then renewal stops: taking it back would break the other's sample).
    A catalog error is logged and retried at the next tick: the lease still has two thirds left.
    """

    def __init__(self, store: _Renews, job_key: str, owner: str, lease_s: float) -> None:
        self.store, self.job_key, self.owner, self.lease_s = store, job_key, owner, lease_s
        self.renewals = 0
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kscope-lease-{job_key}", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.lease_s / 3.0):
            try:
                held = self.store.renew_lease(self.job_key, self.owner, self.lease_s)
            except Exception as exc:  # the catalog is down: try again at the next tick
                log.warning("job %s: lease not renewed (%s)", self.job_key, exc)
                continue
            if not held:
                log.warning("job %s: lease lost to another instance", self.job_key)
                self.lost.set()
                return
            self.renewals += 1
