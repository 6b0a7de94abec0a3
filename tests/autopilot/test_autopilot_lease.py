"""A running sample keeps its job's lease (kinetoscope.autopilot.lease): a second instance cannot
take the job over while the owner renews, can once it stops, and the owner then learns it lost
the lease. A real SQLite catalog; the takeover is judged at explicit times, so thread scheduling
on a loaded host can only delay renewals, never change the outcome."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

from kinetoscope.autopilot.lease import LeaseKeeper
from kinetoscope.store.catalog import Catalog
from kinetoscope.store.fleet import FleetStore, SeenJob, utcnow

LEASE_S = 0.9
KEY = "torch:h:29500:job-1"


def _store_with_claimed_job(tmp_path: Path) -> tuple[Catalog, FleetStore, object]:
    cat = Catalog.open(str(tmp_path / "c.db"))
    store = FleetStore(cat)
    job = SeenJob(
        KEY, "job-1", "train.py", ["h:1778"], [{"host": "h:1778", "pid": 1, "rank": 0}], 1, 1, False, 60.0
    )
    store.upsert_jobs([job], warmup_s=0)
    t0 = utcnow()
    assert store.claim(KEY, "a", "s-1", ["h:1778"], LEASE_S, 3600, {"pids": [1]}, now=t0)
    return cat, store, t0


def _wait(predicate, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_renewed_lease_is_not_taken_over(tmp_path: Path) -> None:
    cat, store, t0 = _store_with_claimed_job(tmp_path)
    after_first_lease = t0 + timedelta(seconds=LEASE_S + 0.2)
    try:
        with LeaseKeeper(store, KEY, "a", LEASE_S) as keeper:
            # the first renewal comes a third of a lease after the claim: its lease ends after
            # t0 + 4/3 lease, beyond the time the other instance asks at
            assert _wait(lambda: keeper.renewals >= 1)
            assert not store.take_over("s-1", "b", LEASE_S, now=after_first_lease)
        assert not keeper.lost.is_set()
    finally:
        cat.close()


def test_an_unrenewed_lease_is_taken_over_and_its_old_owner_learns_it(tmp_path: Path) -> None:
    cat, store, t0 = _store_with_claimed_job(tmp_path)
    try:
        assert store.take_over("s-1", "b", 3600, now=t0 + timedelta(seconds=LEASE_S + 0.2))
        assert [s.owner for s in store.active_samples()] == ["b"]
        with LeaseKeeper(store, KEY, "a", LEASE_S) as keeper:
            assert keeper.lost.wait(60)
        assert keeper.renewals == 0
        assert not store.renew_lease(KEY, "a", LEASE_S) and store.renew_lease(KEY, "b", LEASE_S)
    finally:
        cat.close()
