"""The aligned roundup follows the job's measured pace (``service.roundup_for``): a job's step
time in its latest analysed sample replaces the assumed 10 steps/s, so a slow job's trace starts
within the policy's timeout and a fast job's ranks miss alignment no more often than intended.

The pace comes from the catalog (``FleetStore.step_times_ms``: the latest analysed sample, recorded
or unusable; a sample without an analysis says nothing), and the planner asks with it (a simulated
fleet of real RPC servers, ``benchmarks/sim_fleet``)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sim_fleet import SimFleet

from kinetoscope.autopilot.policy import Policy
from kinetoscope.autopilot.service import Autopilot, AutopilotConfig, CycleReport, roundup_for
from kinetoscope.collect.trigger import ALIGN_SAFETY, ALIGN_SLACK_S
from kinetoscope.collect.window_fit import expected_end_s
from kinetoscope.store.catalog import Catalog
from kinetoscope.store.fleet import FleetStore, SeenJob

RANKS = [{"pid": 1, "poll_s": 1.0}, {"pid": 2, "poll_s": 1.0}]
ITERATIONS = 10


def _odds(roundup: int, steps_per_s: float, poll_s: float = 1.0) -> float:
    """Misalignment odds: steps the job does in a pickup spread, over the roundup (collect/window_fit)."""
    return steps_per_s * (poll_s + ALIGN_SLACK_S) / roundup


def test_one_rank_needs_no_roundup() -> None:
    assert roundup_for(RANKS[:1]) is None and roundup_for(RANKS[:1], 2000.0) is None


@pytest.mark.parametrize("step_ms", [0.0, -5.0, None])
def test_an_unknown_pace_keeps_the_assumed_one(step_ms: float | None) -> None:
    assert roundup_for(RANKS, step_ms) == roundup_for(RANKS)


def test_a_slow_job_starts_within_the_timeout_only_at_its_own_pace() -> None:
    timeout = Policy().trace_timeout_s
    rate = 0.5  # one step every 2 s
    assumed, measured = roundup_for(RANKS), roundup_for(RANKS, 1000.0 / rate)
    assert assumed is not None and measured is not None
    assert expected_end_s(assumed, rate, 1.0, ITERATIONS) > timeout
    assert expected_end_s(measured, rate, 1.0, ITERATIONS) <= timeout


@pytest.mark.parametrize("rate", [30.0, 120.0, 0.25])
def test_any_pace_misses_alignment_no_more_often_than_intended(rate: float) -> None:
    measured = roundup_for(RANKS, 1000.0 / rate)
    assert measured is not None and _odds(measured, rate) <= 1.0 / ALIGN_SAFETY
    if rate > 10:  # the assumed pace under-counts a fast job's steps: its odds are higher
        assumed = roundup_for(RANKS)
        assert assumed is not None and _odds(assumed, rate) > 1.0 / ALIGN_SAFETY


def _analysed(
    cat: Catalog, store: FleetStore, folder: Path, job: str, sid: str, at: datetime, **end: object
) -> None:
    """A sample of ``job`` claimed at ``at`` and finished as ``end`` (state, step_ms)."""
    assert store.claim(job, "test", sid, ["h:1778"], 60, 0, {"pids": [1, 2]}, now=at)
    analysis_id = None
    if end.get("step_ms") is not None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{sid}.json").write_text("{}", encoding="utf-8")
        doc = {"summary": {"step_time_ms": end["step_ms"]}, "sample": sid}
        analysis_id = cat.record_analysis([str(folder / f"{sid}.json")], doc).id
    store.finish(sid, str(end["state"]), analysis_id=analysis_id)


def test_the_pace_is_the_latest_analysed_sample_s(catalog_url: str, tmp_path: Path) -> None:
    t0 = datetime.now(timezone.utc) - timedelta(hours=5)
    with Catalog.open(catalog_url) as cat:
        store = FleetStore(cat)
        jobs = ["job:a", "job:b", "job:c"]
        store.upsert_jobs(
            [SeenJob(k, k, "python train.py", ["h:1778"], RANKS, 2, 2, False, 600) for k in jobs], warmup_s=0
        )
        hour = timedelta(hours=1)
        _analysed(cat, store, tmp_path, "job:a", "s-a1", t0, state="recorded", step_ms=40.0)
        _analysed(cat, store, tmp_path, "job:a", "s-a2", t0 + hour, state="unusable", step_ms=50.0)
        _analysed(cat, store, tmp_path, "job:a", "s-a3", t0 + 2 * hour, state="failed")  # no analysis
        _analysed(cat, store, tmp_path, "job:b", "s-b1", t0, state="recorded", step_ms=2000.0)
        assert store.step_times_ms(jobs) == {"job:a": 50.0, "job:b": 2000.0}
        assert store.step_times_ms(["job:b"]) == {"job:b": 2000.0} and store.step_times_ms([]) == {}
        many = [f"job:x{i}" for i in range(1200)] + jobs  # asked in bounded batches
        assert store.step_times_ms(many) == {"job:a": 50.0, "job:b": 2000.0}


def test_the_planner_asks_with_the_job_s_pace(tmp_path: Path) -> None:
    policy = Policy(warmup_s=0, min_age_s=0, interval_s=3600, iterations=3, rpc_timeout_s=5, workers=4)
    url = str(tmp_path / "catalog.db")
    with SimFleet(2, procs_per_host=2, trace_root=str(tmp_path / "traces")) as fleet:
        pilot = Autopilot(
            AutopilotConfig(hosts=fleet.addresses, catalog_url=url, policy=policy, instance="p")
        )
        try:
            report = CycleReport()
            first = pilot.plan(report, set(pilot.discover(report).failed))
            assert len(first) == 2
            ranks = {j["job_key"]: j["ranks"] for j in pilot.store.jobs()}
            assert all(s.request["iteration_roundup"] == roundup_for(ranks[s.job_key]) for s in first)
            slow = first[0]
            doc = {"summary": {"step_time_ms": 2000.0}}
            (tmp_path / "slow.json").write_text("{}", encoding="utf-8")
            analysis = pilot.catalog.record_analysis([str(tmp_path / "slow.json")], doc)
            pilot.store.finish(slow.sample_id, "recorded", analysis_id=analysis.id)
            assert pilot.store.make_due(slow.job_key, 0)
            again = pilot.plan(CycleReport(), set())
            assert [s.job_key for s in again] == [slow.job_key]
            assert again[0].request["iteration_roundup"] == roundup_for(ranks[slow.job_key], 2000.0)
            assert again[0].request["iteration_roundup"] < slow.request["iteration_roundup"]
        finally:
            pilot.close()
