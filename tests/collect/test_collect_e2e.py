"""End to end with the real daemon (kscope daemon subprocess) and real PyTorch processes.

No mock of PyTorch: the processes are unmodified training loops with KINETO_USE_DAEMON=1; Kineto
polls the daemon over the IPC fabric and writes the trace files itself."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from kinetoscope.collect.trigger import Target, TraceOptions, TraceRequest, trigger_trace, wait_for_trace
from kinetoscope.demo.driver import inspect_trace_file
from kinetoscope.protocol.manifest import read_manifest


def count_optimizer_steps(path: str) -> int:
    return inspect_trace_file(path)["optimizer_steps"]


pytestmark = pytest.mark.torch


def test_iteration_trace_has_exactly_n_optimizer_steps(single_torch_job):
    daemon, _job, pid = single_torch_job
    res = trigger_trace(TraceRequest([daemon.address], Target(pids=(pid,)), TraceOptions(iterations=7)))
    assert res.ok, res.errors
    assert [(m.pid, m.triggered) for m in res.matched] == [(pid, True)]
    res = wait_for_trace(res, timeout=60)
    assert res.ok, [e.message for e in res.errors]
    (f,) = res.files
    # not under torchrun: no RANK, so the file is named after the host (architecture.md)
    assert f.rank is None and res.matched[0].rank is None
    assert f.complete and f.bytes and Path(f.path).name == f"{res.matched[0].hostname}_{pid}.pt.trace.json"
    assert count_optimizer_steps(f.path) == 7
    doc = orjson.loads(Path(f.path).read_bytes())
    assert doc["trace_id"] == res.trace_id  # REQUEST_TRACE_ID reached Kineto
    names = {e.get("name") for e in doc["traceEvents"] if isinstance(e, dict)}
    assert "Optimizer.step#SGD.step" in names
    manifest = read_manifest(res.output_dir)
    assert [(m.pid, m.rank, m.complete, m.bytes) for m in manifest.files] == [(pid, None, True, f.bytes)]


def test_cli_duration_trace_by_pid_json(single_torch_job, run_kscope):
    daemon, _job, pid = single_torch_job
    r = run_kscope(
        "trace",
        "--host",
        str(daemon.address),
        "--pids",
        str(pid),
        "--duration-ms",
        "300",
        "--record-shapes",
        "--wait",
        "--timeout",
        "60",
        "--json",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    doc = orjson.loads(r.stdout)
    assert doc["errors"] == []
    assert [(m["pid"], m["rank"]) for m in doc["matched"]] == [(pid, None)]
    assert doc["matched"][0]["cmdline"].endswith("--quiet") and doc["matched"][0]["kineto_job_id"] == "0"
    # outside Slurm the job is named by its launcher (docs/deploy.md §5), never "0"
    assert (
        doc["matched"][0]["job_id"].startswith("launcher:") and doc["matched"][0]["job_source"] == "launcher"
    )
    (f,) = doc["files"]
    assert f["complete"] is True and f["bytes"] > 0 and f["pid"] == pid
    assert os.path.dirname(f["path"]) == doc["output_dir"]
    assert doc["output_dir"].endswith(doc["trace_id"])
    trace = orjson.loads(Path(f["path"]).read_bytes())
    assert any("Input Dims" in (e.get("args") or {}) for e in trace["traceEvents"] if isinstance(e, dict))
    assert "PROFILE_REPORT_INPUT_SHAPES=true" in doc["config"]
    assert read_manifest(doc["output_dir"]).files[0].complete


def test_cli_nothing_matched_says_what_is_registered(single_torch_job, run_kscope):
    daemon, _job, _pid = single_torch_job
    r = run_kscope("trace", "--host", str(daemon.address), "--job-id", "123", "--iterations", "2")
    assert r.returncode == 1
    flat = " ".join(r.stderr.split())
    assert "no process on host " in flat and f"({daemon.address}) has job id 123; registered: " in flat
    assert "job launcher:" in flat and "Traceback" not in r.stderr  # job identity, never "job 0"


def test_unreachable_host_among_good_ones(single_torch_job, free_port, run_kscope):
    daemon, _job, _pid = single_torch_job
    r = run_kscope(
        "trace",
        "--host",
        f"127.0.0.1:{free_port}",
        "--host",
        str(daemon.address),
        "--job-id",
        "999",
        "--duration-ms",
        "100",
        "--json",
    )
    assert r.returncode == 1
    doc = orjson.loads(r.stdout)
    kinds = sorted(e["kind"] for e in doc["errors"])
    assert kinds == ["no_match", "unreachable"]
    unreachable = next(e for e in doc["errors"] if e["kind"] == "unreachable")
    assert unreachable["host"] == f"127.0.0.1:{free_port}" and "connection refused" in unreachable["message"]


def test_timeout_names_process_path_and_cause(single_torch_job, run_kscope):
    """A duration trace cannot finish within 1 s (Kineto waits 5 s first): the error says which
    process, which path, and what stage it reached. Runs last in this module: the trace it
    starts is still running afterwards (we wait for it so the process is free again)."""
    daemon, _job, pid = single_torch_job
    r = run_kscope(
        "trace",
        "--host",
        str(daemon.address),
        "--pids",
        str(pid),
        "--duration-ms",
        "200",
        "--wait",
        "--timeout",
        "1",
        "--json",
    )
    assert r.returncode == 1
    doc = orjson.loads(r.stdout)
    (err,) = doc["errors"]
    assert err["kind"] == "timeout" and err["pid"] == pid
    assert err["path"] == doc["files"][0]["path"]
    assert err["message"].startswith(
        f"pid {pid} on {daemon.address}: {err['path']} did not appear within 1 s"
    )
    # 1 s is about one poll interval: either the config is not picked up yet, or Kineto is in its warmup
    # (after the pickup, Kineto may already have created its <file>.tmp: the message then says so)
    assert ("but has not picked up the trace config yet" in err["message"]) or (
        "the process picked up the config" in err["message"]
        and "but a duration trace needs about 6 s" in err["message"]
    ), err["message"]
    # let that trace finish so the process is free again
    from kinetoscope.collect.trigger import TraceFile, TraceResult

    pending = TraceResult(
        trace_id=doc["trace_id"],
        hosts=[daemon.address],
        target=Target(pids=(pid,)),
        options=TraceOptions(duration_ms=200),
        files=[TraceFile(host=str(daemon.address), pid=pid, rank=None, path=err["path"])],
    )
    assert wait_for_trace(pending, timeout=60, write_manifest_file=False).ok


@pytest.mark.slow
def test_ddp_job_traced_by_job_id(tmp_path):
    pytest.importorskip("torch")
    from kinetoscope.demo.local import LocalDaemon, TrainingJob

    with LocalDaemon(tmp_path) as daemon:
        env = {**daemon.kineto_env(), "SLURM_JOB_ID": "36199"}
        with TrainingJob(
            tmp_path,
            ranks=2,
            steps=0,
            model="tiny",
            straggler="intermittent",
            straggler_rank=1,
            max_seconds=200,
            env=env,
            extra_args=["--step-sleep-ms", "10", "--quiet"],
        ) as job:
            ranks = daemon.wait_for_processes(2, job_id=36199, timeout=120, alive=job.alive)
            job.wait_for_steps(3, timeout=120)
            step = max(d["step"] for d in job.progress().values())
            roundup = step + 60  # > current step: both ranks start at this iteration
            # a Slurm array id counts by its numeric prefix, as in Kineto
            from kinetoscope.collect.trigger import parse_job_id

            jid, note = parse_job_id("36199_0")
            assert note
            res = trigger_trace(
                TraceRequest(
                    [daemon.address],
                    Target(job_id=jid, job_id_text="36199_0"),
                    TraceOptions(iterations=4, iteration_roundup=roundup),
                )
            )
            assert res.ok, [e.message for e in res.errors]
            launcher = [m for m in res.matched if m.state == "launcher"]
            assert [m.pid for m in launcher] == [job.pid]  # torchrun's agent matched, not traced
            assert sorted((m.rank, m.world_size) for m in res.triggered) == [(0, 2), (1, 2)]
            res = wait_for_trace(res, timeout=90)
            assert res.ok, [e.message for e in res.errors]
    rank_pids = {p.rank: p.pid for p in ranks}
    assert job.pid not in {f.pid for f in res.files}
    names = sorted(Path(f.path).name for f in res.files)
    assert names == [f"rank-0_{rank_pids[0]}.pt.trace.json", f"rank-1_{rank_pids[1]}.pt.trace.json"]
    manifest = read_manifest(res.output_dir)
    assert sorted((f.rank, f.world_size, f.job_id, f.pid, f.complete) for f in manifest.files) == [
        (0, 2, "36199", rank_pids[0], True),
        (1, 2, "36199", rank_pids[1], True),
    ]
    for f in manifest.files:
        assert count_optimizer_steps(f.path) == 4
    # the analyzer's loader attributes ranks from the manifest (on-demand traces lack distributedInfo)
    from kinetoscope.trace.metadata import resolve_rank

    for f in manifest.files:
        rank, world, source, _ = resolve_rank(f.path, {})
        assert (rank, world, source) == (f.rank, 2, "manifest")
