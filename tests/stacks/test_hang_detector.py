"""The autopilot's hang detector on CPU readings (kinetoscope.autopilot.hang): idle ranks make a
job due after ``for_s``, a busy rank resets it, and the first sweep only records."""

from __future__ import annotations

from kinetoscope.autopilot.hang import HangDetector, HangPolicy
from kinetoscope.store.fleet import SeenJob


def _job(cpu: list[float], key: str = "slurm:1") -> SeenJob:
    ranks = [
        {"host": "h:1778", "hostname": "h", "pid": 100 + i, "rank": i, "cpu_s": c} for i, c in enumerate(cpu)
    ]
    return SeenJob(
        job_key=key, job_id="1", cmdline=None, hosts=["h:1778"], ranks=ranks, world_size=len(cpu),
        devices=len(cpu), opted_out=False, age_s=10.0,
    )  # fmt: skip


def test_second_sweep_judges_every_rank() -> None:
    det = HangDetector(HangPolicy(for_s=5, idle_cpu_pct=5))
    assert det.observe([_job([1.0, 1.0, 1.0, 1.0])], now=0) == ([], [])  # baseline only
    due, busy = det.observe([_job([1.01, 1.0, 1.0, 1.0])], now=10)  # idle since the first sweep
    assert [j.job_key for j in due] == ["slurm:1"] and busy == []


def test_a_busy_rank_resets_and_ends_the_episode() -> None:
    det = HangDetector(HangPolicy(for_s=30, idle_cpu_pct=5))
    det.observe([_job([1.0, 1.0])], now=0)
    assert det.observe([_job([1.0, 1.0])], now=10) == ([], [])  # idle 10 s, not yet 30
    due, busy = det.observe([_job([1.0, 9.0])], now=20)  # rank 1 used 80 % of a core
    assert due == [] and busy == ["slurm:1"] and "slurm:1" not in det.idle_since
    det.observe([_job([1.0, 9.0])], now=30)
    assert det.observe([_job([1.0, 9.0])], now=45) == ([], [])  # idle again only since 20
    due, _ = det.observe([_job([1.0, 9.0])], now=51)
    assert [j.job_key for j in due] == ["slurm:1"]


def test_checked_jobs_wait_min_gap() -> None:
    det = HangDetector(HangPolicy(for_s=0, min_gap_s=100))
    det.observe([_job([1.0])], now=0)
    det.checked["slurm:1"] = 5.0
    assert det.observe([_job([1.0])], now=10)[0] == []
    assert det.may_check("slurm:1", now=106)


def test_a_job_busy_again_closes_its_hang_episode(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from kinetoscope.autopilot.discovery import SweepResult
    from kinetoscope.autopilot.service import Autopilot, AutopilotConfig, CycleReport
    from kinetoscope.store.fleet import FleetStore

    pilot = Autopilot(AutopilotConfig(hosts=[], catalog_url=str(tmp_path / "c.db")))
    try:
        store = FleetStore(pilot.catalog)
        store.upsert_jobs([_job([1.0, 1.0])], warmup_s=0)
        assert store.start_episode("slurm:1", "hang", "stk-x", 1.0, 0.0) is not None
        pilot.hangs(SweepResult(jobs=[_job([1.0, 1.0])]), CycleReport())  # baseline: still open
        assert store.open_alert("slurm:1", "hang") is not None
        pilot.hang_detector.cpu = {k: (v[0] - 10, v[1]) for k, v in pilot.hang_detector.cpu.items()}
        pilot.hangs(SweepResult(jobs=[_job([1.0, 6.0])]), CycleReport())  # rank 1 busy again
        assert store.open_alert("slurm:1", "hang") is None
    finally:
        pilot.close()
