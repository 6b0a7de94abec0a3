"""A single-process job (issue 10 item 2): steps found without any rank, a verdict of its own,
no library warnings (a real profiled torch loop: single_job.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from diag_synth import make_job
from profiled_jobs import run_profiled_job

from kinetoscope.diagnosis import diagnose
from kinetoscope.trace import load_trace

pytestmark = [pytest.mark.slow, pytest.mark.torch]

JOB = Path(__file__).with_name("single_job.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def single_trace(tmp_path_factory):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("single")
    run_profiled_job(JOB, out)
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
    cp = subprocess.run(
        [str(Path(sys.executable).with_name("kscope")), "analyze", str(single_trace), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=REPO,
    )
    assert cp.returncode == 0, cp.stderr
    assert "Warning" not in cp.stderr, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["diagnosis_summary"][0].startswith("SINGLE PROCESS")
    assert (
        doc["job"]["steps_found"] >= 7
        and doc["mfu"]["reason"]
        and "no training steps" not in doc["mfu"]["reason"]
    )


def test_single_rank_headline_on_a_gpu_trace():
    d = diagnose(make_job(1, 6, flavour="nccl", device_name="NVIDIA H100 80GB HBM3"))
    line = d.verdict_lines()[0]
    assert line.startswith("SINGLE PROCESS:") and "GPU busy computing" in line


def test_single_process_traced_through_the_daemon(tmp_path):
    """End to end: a one-process loop with no profiler code and no rank anywhere (no RANK env,
    no torch.distributed), traced on demand by pid through a private daemon; the manifest
    records ``rank: null`` and the diagnosis still finds the steps and gives its verdict."""
    pytest.importorskip("torch")
    from kinetoscope.collect.trigger import Target, TraceOptions, TraceRequest, trigger_trace, wait_for_trace
    from kinetoscope.demo.local import LocalDaemon
    from kinetoscope.protocol.manifest import read_manifest

    with LocalDaemon(tmp_path / "d", trace_root=tmp_path / "traces") as daemon:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_JOB_ID")
        }
        env.update(daemon.kineto_env(), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        work = tmp_path / "job"
        work.mkdir()
        log = open(work / "job.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, str(JOB), str(work), "--serve", "120"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            daemon.wait_for_processes(1, timeout=90, alive=lambda: proc.poll() is None)
            deadline = time.monotonic() + 60
            while "STEP 3" not in (work / "job.log").read_text() and time.monotonic() < deadline:
                time.sleep(
                    0.2
                )  # stepping: an iteration request before the first step becomes a duration trace
            res = trigger_trace(
                TraceRequest([daemon.address], Target(pids=(proc.pid,)), TraceOptions(iterations=8))
            )
            assert not res.errors and len(res.triggered) == 1, res.errors
            res = wait_for_trace(res, timeout=90, poll_interval=0.3)
            assert res.ok, [e.message for e in res.errors]
        finally:
            (work / "stop").touch()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
    trace_dir = Path(res.output_dir or "")
    manifest = read_manifest(trace_dir)
    assert [f.rank for f in manifest.files] == [None]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = diagnose(trace_dir)
    assert d.job_dict()["steps_found"] >= 7, d.summary()
    assert d.verdict_lines()[0].startswith("SINGLE PROCESS: input-bound;"), d.verdict_lines()
    assert "no training steps" not in (d.mfu.reason or "")
    # and through the CLI (the analyses run first and memoise the steps of the rankless trace)
    cp = subprocess.run(
        [str(Path(sys.executable).with_name("kscope")), "analyze", str(trace_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert cp.returncode == 0 and "Warning" not in cp.stderr, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["diagnosis_summary"][0].startswith("SINGLE PROCESS") and doc["job"]["steps_found"] >= 7
