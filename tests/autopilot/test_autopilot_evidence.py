"""The autopilot trusts only good samples: a synthetic repeated-profiling set (20 samples of 5
jobs, later profiling runs of two jobs with kernels stamped before their launches, as PyTorch
issues #192021 and #175790 describe) goes through the real analysis, the sample judgement and
the catalog; the corrupted samples are flagged, counted per job, kept out of the figures, and the
fleet ranking equals that of the same fleet traced cleanly. Counting them as usable would have
changed the ranking (so the test can fail)."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from kinetoscope.autopilot.evidence import MIN_STEPS, judge
from kinetoscope.autopilot.fleetview import fleet_rows, fleet_totals
from kinetoscope.autopilot.policy import Policy
from kinetoscope.autopilot.service import sample_outcome
from kinetoscope.orchestration import AnalyzeRequest, analyze
from kinetoscope.store.catalog import Catalog
from kinetoscope.store.fleet import FleetStore, SeenJob
from tests.autopilot.repeated_profiling import write_sample

# job -> true GPU busy share; 8 GPUs each, one sample per hour: waste ranks A > B > C > D > E
BUSY = {"slurm:1001": 0.30, "slurm:1002": 0.36, "slurm:1003": 0.45, "slurm:1004": 0.55, "slurm:1005": 0.70}
CORRUPTED = {"slurm:1004": (1, 2, 3), "slurm:1005": (2, 3)}  # later profiling runs of these jobs
SAMPLES = 4
POLICY = Policy(interval_s=3600.0)


@cache
def _analysed(root: str, busy: float, corrupt: int) -> tuple[dict, tuple[str, ...]]:
    """One sample's analysis document and files (cached: identical inputs, identical document)."""
    folder = Path(root) / f"b{busy:.3f}-c{corrupt}"
    path = write_sample(folder, busy, corrupt=corrupt, steps=8)
    run = analyze(AnalyzeRequest(inputs=(str(path),)))
    return run.document, tuple(str(p) for p in run.paths)


def _fleet(url: str, root: Path, *, corrupt: bool, policy: Policy = POLICY) -> FleetStore:
    """The 5 jobs and their 20 samples, each analysed and judged as the autopilot does."""
    cat = Catalog.open(url)
    store = FleetStore(cat)
    store.upsert_jobs(
        [
            SeenJob(key, key.split(":")[1], "python train.py", ["h:1778"], [{"pid": 1}], 8, 8, False, 600)
            for key in BUSY
        ],
        warmup_s=0,
    )
    for n in range(SAMPLES):
        for j, (key, busy) in enumerate(BUSY.items()):
            bad = corrupt and n in CORRUPTED.get(key, ())
            doc, paths = _analysed(str(root), busy + 0.01 * (n % 2), 24 if bad else 0)
            state, reason, detail, summary = sample_outcome(doc, list(paths), 8, policy)
            sid = f"kst-20261128-10{n:02d}{j:02d}-{j:012x}"
            assert store.claim(key, "test", sid, ["h:1778"], 60, 0, {"pids": [1]})
            store.finish(sid, state, summary=summary, reason=reason, error=detail)
    return store


def test_repeated_profiling_is_flagged_and_leaves_the_ranking_unchanged(tmp_path: Path) -> None:
    clean = _fleet(str(tmp_path / "clean.db"), tmp_path, corrupt=False)
    dirty = _fleet(str(tmp_path / "dirty.db"), tmp_path, corrupt=True)
    try:
        expected = [r["job_key"] for r in fleet_rows(clean, sort="waste")]
        assert expected == list(BUSY)  # the construction: least busy wastes most
        rows = {r["job_key"]: r for r in fleet_rows(dirty, sort="waste")}
        assert list(rows) == expected
        for key, row in rows.items():
            n_bad = len(CORRUPTED.get(key, ()))
            assert row["timestamp_anomaly_samples"] == n_bad
            assert (row["samples_recorded"], row["samples_unusable"]) == (SAMPLES - n_bad, n_bad)
        flagged = [s for s in dirty.samples() if s.state == "unusable"]
        assert len(flagged) == 5 and {s.reason for s in flagged} == {"timestamp_anomalies"}
        assert all(s.summary["evidence"]["timestamp_anomalies"] == 24 for s in flagged)
        # the figures of the corrupted jobs come from their clean samples only
        clean_rows = {r["job_key"]: r for r in fleet_rows(clean, sort="waste")}
        for key in CORRUPTED:
            assert rows[key]["gpu_busy_pct"] == pytest.approx(clean_rows[key]["gpu_busy_pct"], abs=1.5)
        assert fleet_totals(list(rows.values())).timestamp_anomaly_samples == 5
    finally:
        clean.cat.close()
        dirty.cat.close()


def test_counting_corrupted_samples_would_change_the_ranking(tmp_path: Path) -> None:
    trusting = replace(POLICY, max_timestamp_anomalies=10**9)  # the check off: every sample "usable"
    store = _fleet(str(tmp_path / "trusting.db"), tmp_path, corrupt=True, policy=trusting)
    try:
        assert [r["job_key"] for r in fleet_rows(store, sort="waste")] != list(BUSY)
    finally:
        store.cat.close()


def test_an_evidence_block_decides_when_present(tmp_path: Path) -> None:
    doc, paths = _analysed(str(tmp_path), 0.5, 0)
    assert judge(doc, paths).usable
    bad = {**doc, "evidence": {"usable": False, "reason": "windows do not overlap"}}
    ev = judge(bad, paths)
    assert (ev.usable, ev.reason, ev.detail, ev.source) == (
        False,
        "evidence",
        "windows do not overlap",
        "document",
    )
    counted = {**doc, "evidence": {"timestamp_anomalies": {"kernel_before_launch": 3, "negative_queue": 1}}}
    ev = judge(counted, ())
    assert (ev.usable, ev.reason, ev.timestamp_anomalies) == (False, "timestamp_anomalies", 4)
    assert judge({**doc, "evidence": {"judgement": "usable", "timestamp_anomalies": 0}}, ()).usable


def test_too_few_steps_is_unusable(tmp_path: Path) -> None:
    doc, paths = _analysed(str(tmp_path), 0.5, 0)
    short = write_sample(tmp_path / "short", 0.5, steps=MIN_STEPS - 1)
    run = analyze(AnalyzeRequest(inputs=(str(short),)))
    ev = judge(run.document, run.paths)
    assert (ev.usable, ev.reason) == (False, "too_few_steps"), ev
    assert ev.steps_in_common is not None and ev.steps_in_common < MIN_STEPS


def test_staggered_windows_that_overlap_stay_usable(tmp_path: Path) -> None:
    """``windows_aligned`` False with ``windows_overlap`` True: the steps the ranks share still
    carry a verdict; only windows that do not overlap make the sample unusable."""
    doc, paths = _analysed(str(tmp_path), 0.5, 0)
    base = {k: v for k, v in doc["evidence"].items() if k not in ("usable", "assessed")}
    staggered = {**doc, "evidence": {**base, "windows_aligned": False, "windows_overlap": True}}
    assert judge(staggered, paths).usable
    apart = {**doc, "evidence": {**base, "windows_aligned": False, "windows_overlap": False}}
    ev = judge(apart, paths)
    assert (ev.usable, ev.reason) == (False, "unaligned")
