"""The autopilot against real daemons (one per simulated host) and real PyTorch jobs: every
eligible job sampled and analysed, the opted-out one never, a job killed mid-trace recorded as
ended, and a kill -9 of the autopilot costing no sample and analysing none twice."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from kinetoscope.store.catalog import Catalog
from kinetoscope.store.fleet import FleetStore
from tests.autopilot.conftest import RealFleet, popen_kscope, run_kscope, wait_until, write_policy

pytestmark = pytest.mark.slow


def _samples_by_job(url: str) -> dict[str, list]:
    with Catalog.open(url) as cat:
        out: dict[str, list] = {}
        for s in FleetStore(cat).samples():
            out.setdefault(s.job_key, []).append(s)
        return out


def _jobs(url: str) -> dict[str, dict]:
    with Catalog.open(url) as cat:
        return {j["job_key"]: j for j in FleetStore(cat).jobs()}


def _key_of(jobs: dict[str, dict], pid: int) -> str:
    return next(k for k, j in jobs.items() if any(r["pid"] == pid for r in j["ranks"]))


def _ddp_key(jobs: dict[str, dict]) -> str:
    """The DDP job: the one job with several ranks (its key names the job identity)."""
    return next(k for k, j in jobs.items() if len(j["ranks"]) > 1)


def _check_recorded_once(url: str, sample_ids: list[str]) -> None:
    """Each sample's trace is in the catalog once, with exactly one analysis."""
    with Catalog.open(url) as cat:
        for sid in sample_ids:
            assert cat.get_trace_request(sid) is not None, sid
            analyses = cat.analyses(trace_id=sid, limit=None)
            assert len(analyses) == 1, (sid, analyses)


def _usable_or_unaligned(samples: list) -> None:
    """One sample, recorded; or, for the 2-rank job, unusable only because its ranks' windows
    missed each other. The aligned roundup makes that unlikely, not impossible: ranks pick the
    request up at their own polls, and one rank's pickup can fall after a multiple of the
    roundup that the other's fell before (docs/autopilot.md, "Aligned windows"); the autopilot
    then keeps the sample as unusable, which is what is checked here."""
    assert len(samples) == 1, samples
    s = samples[0]
    if s.state == "unusable":
        assert "windows do not overlap" in (s.error or ""), (s.reason, s.error)
    else:
        assert s.state == "recorded", (s.state, s.reason, s.error)


def _run_once(fleet: RealFleet, url: str, policy: Path, *extra: str) -> None:
    res = run_kscope(
        "autopilot",
        *fleet.host_args(),
        "--catalog",
        url,
        "--policy",
        str(policy),
        "--once",
        *extra,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]


def test_once_samples_every_eligible_job_records_an_ended_one_and_skips_the_opted_out(
    real_fleet: RealFleet, tmp_path: Path
) -> None:
    ending = real_fleet.start_job("ending", "c", step_sleep_ms=5000)
    real_fleet.daemons["c"].wait_for_processes(1, timeout=180)
    ending.wait_for_steps(1, timeout=180)
    url = str(tmp_path / "catalog.db")
    policy = write_policy(tmp_path / "policy.toml")
    proc = popen_kscope(
        "autopilot",
        *real_fleet.host_args(),
        "--catalog",
        url,
        "--policy",
        str(policy),
        "--once",
        "--instance",
        "pilot-1",
        log=tmp_path / "autopilot.log",
    )
    try:

        def ending_triggered() -> bool:
            if not Path(url).exists():
                return False
            jobs = _jobs(url)
            key = next((k for k, j in jobs.items() if any(r["pid"] == ending.pid for r in j["ranks"])), None)
            return key is not None and any(s.state == "triggered" for s in _samples_by_job(url).get(key, []))

        wait_until(ending_triggered, 300, "the ending job's sample to be triggered")
        os.kill(ending.pid, signal.SIGKILL)  # the job dies while its trace is being recorded
        assert proc.wait(timeout=600) == 0, (tmp_path / "autopilot.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    jobs = _jobs(url)
    by_job = _samples_by_job(url)
    single = _key_of(jobs, real_fleet.jobs["single"].pid)
    optout = _key_of(jobs, real_fleet.jobs["optout"].pid)
    ddp = _ddp_key(jobs)
    ended = _key_of(jobs, ending.pid)
    assert jobs[optout]["opted_out"] and optout not in by_job
    assert [s.state for s in by_job[single]] == ["recorded"]
    _usable_or_unaligned(by_job[ddp])
    assert jobs[ddp]["hosts"] == [real_fleet.address("b")] and len(jobs[ddp]["ranks"]) == 2
    assert [(s.state, s.reason) for s in by_job[ended]] == [("job_ended", "exited")]
    recorded = [s.sample_id for s in by_job[single] + by_job[ddp]]
    assert all(s.analysis_id is not None and s.summary["devices"] for s in by_job[single] + by_job[ddp])
    _check_recorded_once(url, recorded)

    # A second cycle: the killed job is marked ended, nothing is due again within the interval.
    _run_once(real_fleet, url, policy, "--instance", "pilot-1")
    assert _jobs(url)[ended]["ended_at"] is not None
    assert {k: len(v) for k, v in _samples_by_job(url).items()} == {k: len(v) for k, v in by_job.items()}

    listing = run_kscope("jobs", "--catalog", url, "--json", "--sort", "waste")
    assert listing.returncode == 0, listing.stderr
    rows = {r["job_key"]: r for r in json.loads(listing.stdout)["jobs"]}
    assert set(rows) == set(jobs)
    assert [s["trace_id"] for s in rows[single]["samples"]] == [by_job[single][0].sample_id]
    assert rows[optout]["samples"] == [] and rows[optout]["opted_out"] is True


def test_kill_9_and_restart_loses_no_sample_and_analyses_none_twice(
    real_fleet: RealFleet, tmp_path: Path
) -> None:
    url = str(tmp_path / "catalog.db")
    policy = write_policy(tmp_path / "policy.toml", iterations=40)
    log = tmp_path / "autopilot.log"
    proc = popen_kscope(
        "autopilot",
        *real_fleet.host_args(),
        "--catalog",
        url,
        "--policy",
        str(policy),
        "--instance",
        "pilot-k",
        log=log,
    )
    try:

        def triggered() -> bool:
            if not Path(url).exists():
                return False
            return any(s.state == "triggered" for v in _samples_by_job(url).values() for s in v)

        wait_until(triggered, 300, "a triggered sample")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    before = _samples_by_job(url)
    assert any(s.state in ("planned", "triggered") for v in before.values() for s in v), "killed too late"
    _run_once(real_fleet, url, policy, "--instance", "pilot-k")
    after = _samples_by_job(url)
    jobs = _jobs(url)
    assert [s.state for s in after[_key_of(jobs, real_fleet.jobs["single"].pid)]] == ["recorded"]
    _usable_or_unaligned(after[_ddp_key(jobs)])
    assert {s.sample_id for v in before.values() for s in v} <= {
        s.sample_id for v in after.values() for s in v
    }
    _check_recorded_once(
        url, [s.sample_id for v in after.values() for s in v if s.state in ("recorded", "unusable")]
    )


@pytest.mark.postgres
def test_once_against_postgresql(real_fleet: RealFleet, tmp_path: Path, pg_url: str) -> None:
    policy = write_policy(tmp_path / "policy.toml")
    hosts = ["--host", real_fleet.address("a"), "--host", real_fleet.address("b")]
    res = run_kscope(
        # the samples analysed by the local process pool (kscope analyze's map/reduce) this time
        "autopilot",
        *hosts,
        "--catalog",
        pg_url,
        "--policy",
        str(policy),
        "--once",
        "--json",
        "--backend",
        "local",
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    jobs = _jobs(pg_url)
    by_job = _samples_by_job(pg_url)
    samples = [(s.state, s.reason, s.error) for v in by_job.values() for s in v]
    assert len(report["started"]) == 2, samples
    assert set(report["finished"].values()) <= {"recorded", "unusable"}, samples
    assert _key_of(jobs, real_fleet.jobs["optout"].pid) not in by_job
    assert [s.state for s in by_job[_key_of(jobs, real_fleet.jobs["single"].pid)]] == ["recorded"]
    _usable_or_unaligned(by_job[_ddp_key(jobs)])
    _check_recorded_once(pg_url, [s.sample_id for v in by_job.values() for s in v])


def test_a_daemon_killed_and_restarted_is_marked_down_then_up(real_fleet: RealFleet, tmp_path: Path) -> None:
    from kinetoscope.demo.local import LocalDaemon

    url = str(tmp_path / "catalog.db")
    policy = write_policy(tmp_path / "policy.toml", backoff_base_s=0, interval_s=3600)
    old = real_fleet.daemons["c"]
    address = real_fleet.address("c")
    assert old.process is not None and old.process.proc is not None
    old.process.proc.kill()  # kill -9: the host's daemon is gone
    old.process.proc.wait(30)
    try:
        _run_once(real_fleet, url, policy)
        with Catalog.open(url) as cat:
            host = {h["address"]: h for h in FleetStore(cat).hosts()}[address]
        assert host["status"] == "down" and host["failures"] == 1 and "refused" in host["last_error"]
        assert all(h["status"] == "up" for a, h in _hosts(url).items() if a != address)
    finally:
        fresh = LocalDaemon(old.workdir / "restarted", extra_args=["--port", str(old.port)])
        fresh.start(timeout=60)
        real_fleet.daemons["c"] = fresh
        old.stop()
    assert real_fleet.address("c") == address
    _run_once(real_fleet, url, policy)
    assert _hosts(url)[address]["status"] == "up" and _hosts(url)[address]["failures"] == 0


def _hosts(url: str) -> dict[str, dict]:
    with Catalog.open(url) as cat:
        return {h["address"]: h for h in FleetStore(cat).hosts()}
