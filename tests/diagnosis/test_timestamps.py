"""Timestamp anomalies (``diagnosis.timestamps``) on real GPU traces, clean and with the
repeated-profiling corruption of PyTorch issues #192021/#175790 reproduced
(``repeated_profiling.py``): counted per trace, named by the evidence block, the affected steps
left out of the verdict, and the verdict itself unchanged."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from kinetoscope.diagnosis import diagnose
from kinetoscope.diagnosis.timestamps import timestamp_anomalies
from kinetoscope.trace import load_trace
from tests.diagnosis.repeated_profiling import corrupt, sample_set

DATA = Path(__file__).resolve().parents[1] / "data"
GPU_JOB = DATA / "gpu_jobs" / "gloo_cuda_clean_w4"


def test_clean_real_traces_have_no_anomaly():
    for f in sorted(GPU_JOB.glob("rank-*.json.gz")):
        ts = timestamp_anomalies(load_trace(f, cache=False))
        assert ts.total == 0 and ts.device_before_launch == 0 and ts.steps == [], f


def test_corrupted_trace_is_counted_and_located(tmp_path):
    src = sorted(GPU_JOB.glob("rank-*.json.gz"))[0]
    with gzip.open(src, "rt") as fh:
        doc, moved = corrupt(json.load(fh))
    assert moved > 10
    out = tmp_path / src.name
    with gzip.open(out, "wt") as fh:
        json.dump(doc, fh)
    ts = timestamp_anomalies(load_trace(out, cache=False))
    assert 0 < ts.device_before_launch <= moved
    assert ts.total == ts.device_before_launch
    assert ts.worst_before_launch_us is not None and 0 < ts.worst_before_launch_us <= 2_000.0
    assert ts.steps and ts.steps == sorted(ts.steps)


def test_repeated_profiling_set_is_flagged_and_the_verdict_holds(tmp_path):
    samples = sample_set(GPU_JOB, tmp_path, n=4)
    docs = [diagnose(s) for s in samples]
    counts = [d.to_dict()["evidence"]["timestamp_anomalies"] for d in docs]
    assert counts[0] == 0 and all(c > 0 for c in counts[1:]), counts
    clean, later = docs[0], docs[1:]
    for d in later:
        ev = d.to_dict()["evidence"]
        named = [a for a in ev["anomalies"] if a["kind"] == "device_before_launch"]
        assert len(named) == 4 and all("stamped before their launch" in a["message"] for a in named)
        # the corrupted steps are left out, so the verdict does not rest on them
        assert ev["excluded_steps"] and all(a["left_out"].startswith("step(s) ") for a in named)
        assert not ev["anomalous"] and d.stragglers.kind == clean.stragglers.kind
        assert "device event(s) stamped before their launch" in next(
            s for s in d.summary() if s.startswith("Evidence:")
        )
