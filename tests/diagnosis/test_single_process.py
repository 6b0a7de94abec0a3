"""A single-process job (issue 10 item 2): steps found without any rank, a verdict of its own,
no library warnings (a real profiled torch loop: single_job.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from diag_synth import make_job

from kinetoscope.diagnosis import diagnose
from kinetoscope.trace import load_trace

pytestmark = [pytest.mark.slow, pytest.mark.torch]

JOB = Path(__file__).with_name("single_job.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def single_trace(tmp_path_factory):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("single")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, str(JOB), str(out)], check=True, env=env, timeout=300, capture_output=True)
    return out / "train.pt.trace.json"


def test_steps_found_without_a_rank(single_trace):
    t = load_trace(single_trace)
    assert t.meta.rank is None  # no rank in the file, its name or a manifest
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the Polars "comparisons with None" warnings are gone
        d = diagnose(single_trace)
    job = d.job_dict()
    assert job["steps_found"] >= 7 and job["step_source"] == "optimizer"
    assert "no training steps" not in (d.mfu.reason or "")
    assert d.mfu.step_time_s and d.mfu.step_time_s > 0.010  # the 15 ms loads are in the step


def test_single_process_headline_is_verdict_first(single_trace):
    d = diagnose(single_trace)
    lines = d.verdict_lines()
    assert 1 <= len(lines) <= 2
    assert lines[0].startswith("SINGLE PROCESS: input-bound;"), lines
    assert "data loading" in lines[0] and "host compute" in lines[0]
    assert lines[1].startswith("Top recommendation") and "Data-loader stalls" in lines[1]
    assert "dataloader_fraction" in lines[1]  # the evidence, with its numbers
    assert str(d.summary()).splitlines()[0] == lines[0]
    assert not any("NO STRAGGLER" in ln for ln in d.summary())


def test_kscope_analyze_single_process_no_warnings(single_trace):
    env = {**os.environ, "COLUMNS": "200"}
    cp = subprocess.run([str(Path(sys.executable).with_name("kscope")), "analyze", str(single_trace), "--json"],
                        capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert cp.returncode == 0, cp.stderr
    assert "Warning" not in cp.stderr, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["diagnosis_summary"][0].startswith("SINGLE PROCESS")
    assert doc["job"]["steps_found"] >= 7 and doc["mfu"]["reason"] and "no training steps" not in doc["mfu"]["reason"]


def test_single_rank_headline_on_a_gpu_trace():
    d = diagnose(make_job(1, 6, flavour="nccl", device_name="NVIDIA H100 80GB HBM3"))
    line = d.verdict_lines()[0]
    assert line.startswith("SINGLE PROCESS:") and "GPU busy computing" in line
