"""Detectors on a real profiled loop (CPU): torch.compile recompiles, math-path attention, FLOPs
from recorded shapes (feature_job.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from profiled_jobs import run_profiled_job

from kinetoscope.diagnosis import diagnose

pytestmark = [pytest.mark.slow, pytest.mark.torch]

JOB = Path(__file__).with_name("feature_job.py")


@pytest.fixture(scope="module")
def feature_trace(tmp_path_factory):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("features")
    run_profiled_job(JOB, out)
    return out


def test_detectors_on_a_real_trace(feature_trace):
    d = diagnose(feature_trace, peak_flops=1e11)
    recs = {r["id"]: r for r in d.recommendations}
    rc = recs["recompilation"]
    assert rc["evidence"]["recompiles"] >= 3 and rc["evidence"]["compile_time_ms"] > 0
    assert "mark_dynamic" in rc["action"]
    at = recs["attention-math-path"]
    assert at["evidence"]["math_sdpa_ops"] >= 4 and at["evidence"]["matmul_softmax_matmul_patterns"] >= 4
    assert "scaled_dot_product_attention" in at["action"]
    assert d.mfu.flops_source == "shapes" and d.mfu.flops_per_step > 0 and d.mfu.mfu is not None
    assert d.job_dict()["step_source"] == "optimizer"
