"""Launch-bound evidence (seed 001: CUDA graphs) on the real 8-rank DLRM V100 job: the
host-bound gaps recomputed from the raw JSON with the standard library."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest
from digests import assert_digests_diagnose_alike

from kinetoscope.diagnosis import diagnose
from kinetoscope.diagnosis.detectors import detect_launch_gaps, launch_gap_counts, pooled_launch_gaps
from kinetoscope.trace import load_trace

DLRM8 = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "param_dlrm8"
pytestmark = pytest.mark.skipif(not DLRM8.is_dir(), reason=f"real DLRM job traces not found at {DLRM8}")


def _raw_gaps(path: Path) -> list[float]:
    """Gaps (µs) before a device event launched after the GPU ran out of queued work."""
    ev = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    launch: dict[int, float] = {}
    for e in ev:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            c = e["args"]["correlation"]
            launch[c] = min(launch.get(c, e["ts"]), e["ts"])
    dev = sorted(
        (
            e
            for e in ev
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "stream" in e.get("args", {})
        ),
        key=lambda e: e["ts"],
    )
    gaps, front = [], None
    for e in dev:
        lts = launch.get(e["args"].get("correlation"))
        if front is not None and e["ts"] > front and lts is not None and lts > front:
            gaps.append(e["ts"] - front)
        front = e["ts"] + e["dur"] if front is None else max(front, e["ts"] + e["dur"])
    return gaps


def test_median_launch_gap_matches_raw_json():
    f = min(DLRM8.glob("*.pt.trace.json"))
    raw = _raw_gaps(f)
    got = detect_launch_gaps(load_trace(f))
    assert len(got.gaps_us) == len(raw) and len(raw) > 50
    assert got.median_gap_us == pytest.approx(statistics.median(raw), abs=0.01)


def test_launch_bound_carries_the_cuda_graph_estimate():
    d = diagnose(DLRM8)
    ev = next(r for r in d.recommendations if r["id"] == "launch-bound")["evidence"]
    # kscope analyze diagnoses digests (no events): the same evidence from the ranks' figures
    assert_digests_diagnose_alike(d, "recommendations")
    assert (
        ev["kernels_per_step"] > 100
        and ev["host_bound_gaps_per_step"] > 50
        and ev["median_launch_gap_us"] > 0
    )
    # graphs remove the launch gaps: step / (step - gap) = 1 / (1 - launch_gap_fraction)
    assert ev["est_speedup_cuda_graph"] == pytest.approx(1 / (1 - ev["launch_gap_fraction"]), rel=0.01)


@pytest.mark.parametrize("n_ranks", [1, 2, 3])
def test_pooled_gap_counts_give_the_median_of_every_gap(n_ranks):
    """The per-rank figure (gap lengths counted) gives the pooled median and count of the raw
    gaps exactly, odd and even totals alike."""
    traces = [load_trace(f) for f in sorted(DLRM8.glob("*.pt.trace.json"))[:n_ranks]]
    raw = [g for t in traces for g in detect_launch_gaps(t).gaps_us]
    assert pooled_launch_gaps([launch_gap_counts(t) for t in traces]) == (float(np.median(raw)), len(raw))
    assert pooled_launch_gaps([]) == (None, 0)
