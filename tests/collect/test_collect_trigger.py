"""Trigger orchestration against small real RPC servers that answer like kscope daemons.

These pin the multi-host logic and every failure message deterministically; tests with the real
daemon and real PyTorch processes are in test_collect_e2e.py."""

from __future__ import annotations

from pathlib import Path

import orjson

from kinetoscope.collect.client import parse_host
from kinetoscope.collect.trigger import Target, TraceOptions, TraceRequest, trigger_trace, wait_for_trace
from kinetoscope.protocol.manifest import read_manifest


def fake_daemon(
    rpc_server,
    hostname: str,
    root: Path,
    procs: list[dict],
    status: dict | None = None,
    registered: str = "nothing",
    listing: list[dict] | None = None,
):
    """procs: [{"pid", "rank", "job_id", ...}]; status: pid -> overrides of its status entry."""
    status = status if status is not None else {}

    def trace(req):
        out = Path(req.get("output_dir") or root) / req["trace_id"]
        matched = []
        for p in procs:
            if "job_id" in req and str(p.get("job_id")) != str(req["job_id"]):
                continue
            if "pids" in req and p["pid"] not in req["pids"]:
                continue
            name = (
                f"rank-{p['rank']}_{p['pid']}.pt.trace.json"
                if p.get("rank") is not None
                else f"{hostname}_{p['pid']}.pt.trace.json"
            )
            matched.append(
                {
                    **p,
                    "cmdline": p.get("cmdline", "python train.py"),
                    "path": str(out / name),
                    "triggered": not p.get("busy", False),
                    "busy": p.get("busy", False),
                }
            )
        for m in matched:
            m["_trace_dir"] = str(out)
        trace.last = matched
        return {
            "hostname": hostname,
            "trace_id": req["trace_id"],
            "output_dir": str(out),
            "matched": matched,
            "registered": registered,
            "config": "PROFILE_START_TIME=0\nACTIVITIES_DURATION_MSECS=500",
        }

    trace.last = []

    def trace_status(req):
        files = []
        for m in trace.last:
            p = Path(m["path"])
            entry = {
                "pid": m["pid"],
                "rank": m.get("rank"),
                "path": m["path"],
                "exists": p.exists(),
                "bytes": p.stat().st_size if p.exists() else None,
                "complete": p.exists(),
                "delivered": True,
                "alive": True,
            }
            entry.update(status.get(m["pid"], {}))
            files.append(entry)
        return {"hostname": hostname, "files": files}

    handlers = {"kscopeTrace": trace, "kscopeTraceStatus": trace_status}
    if listing is not None:
        handlers["kscopeListProcesses"] = lambda req: {"hostname": hostname, "processes": listing}
    return rpc_server(handlers)


def write_trace(path: str, body: bytes = b'{"traceEvents": []}\n') -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(body)


def test_two_hosts_matched_files_and_manifest(rpc_server, tmp_path):
    a = fake_daemon(rpc_server, "node-a", tmp_path, [{"pid": 11, "rank": 0, "world_size": 2, "job_id": "7"}])
    b = fake_daemon(rpc_server, "node-b", tmp_path, [{"pid": 22, "rank": 1, "world_size": 2, "job_id": "7"}])
    hosts = [parse_host(a.address), parse_host(b.address)]
    res = trigger_trace(
        TraceRequest(
            hosts, Target(job_id=7), TraceOptions(iterations=5), output_dir=str(tmp_path), trace_id="t-1"
        )
    )
    assert res.ok, res.errors
    (req,) = [r for r in a.requests if r["fn"] == "kscopeTrace"]
    assert req["job_id"] == 7 and req["iterations"] == 5
    assert req["output_dir"] == str(tmp_path)
    assert req["iteration_roundup"] == 1  # these daemons answer no listing: nothing known to align
    assert [(m.hostname, m.pid, m.rank) for m in res.matched] == [("node-a", 11, 0), ("node-b", 22, 1)]
    assert res.output_dir == str(tmp_path / "t-1")
    manifest = read_manifest(tmp_path / "t-1")
    assert [(f.host, f.rank, f.complete) for f in manifest.files] == [
        ("node-a", 0, False),
        ("node-b", 1, False),
    ]

    for f in res.files:
        write_trace(f.path)
    res = wait_for_trace(res, timeout=10, poll_interval=0.05)
    assert res.ok, res.errors
    assert all(f.complete and f.bytes == 20 for f in res.files)
    manifest = read_manifest(tmp_path / "t-1")
    assert all(f.complete and f.bytes == 20 for f in manifest.files)
    assert manifest.updated is not None
    doc = res.to_json()
    assert set(doc) >= {"trace_id", "matched", "files", "errors"}
    assert set(doc["matched"][0]) >= {"host", "pid", "rank", "job_id", "cmdline"}
    assert set(doc["files"][0]) == {"host", "pid", "rank", "path", "bytes", "complete"}
    orjson.dumps(doc)


def test_nothing_matched_names_host_and_what_is_registered(rpc_server, tmp_path):
    srv = fake_daemon(
        rpc_server,
        "node-a",
        tmp_path,
        [{"pid": 11, "rank": 0, "job_id": "0"}],
        registered="job 0 (3 processes)",
    )
    res = trigger_trace(
        TraceRequest([parse_host(srv.address)], Target(job_id=123), TraceOptions(duration_ms=500))
    )
    assert not res.ok
    assert [e.kind for e in res.errors] == ["no_match"]
    assert res.errors[0].message == (
        f"no process on host node-a ({srv.address}) has job id 123; registered: job 0 (3 processes)"
    )
    assert not res.files and res.manifest_paths == []


def test_unreachable_host_is_reported_and_others_still_traced(rpc_server, tmp_path, free_port):
    a = fake_daemon(rpc_server, "node-a", tmp_path, [{"pid": 11, "rank": 0, "job_id": "0"}])
    hosts = [parse_host(a.address), parse_host(f"127.0.0.1:{free_port}")]
    res = trigger_trace(
        TraceRequest(hosts, Target(all=True), TraceOptions(duration_ms=500), output_dir=str(tmp_path))
    )
    assert [m.pid for m in res.matched] == [11]
    assert [e.kind for e in res.errors] == ["unreachable"]
    assert res.errors[0].host == f"127.0.0.1:{free_port}"
    assert "connection refused" in res.errors[0].message


def test_only_unreachable_gives_no_extra_no_match(free_port):
    res = trigger_trace(
        TraceRequest([parse_host(f"127.0.0.1:{free_port}")], Target(all=True), TraceOptions(duration_ms=500))
    )
    assert [e.kind for e in res.errors] == ["unreachable"]


def test_busy_process_is_an_error(rpc_server, tmp_path):
    srv = fake_daemon(rpc_server, "node-a", tmp_path, [{"pid": 11, "rank": 0, "busy": True}])
    res = trigger_trace(
        TraceRequest(
            [parse_host(srv.address)],
            Target(pids=(11,)),
            TraceOptions(duration_ms=500),
            output_dir=str(tmp_path),
        )
    )
    assert [e.kind for e in res.errors] == ["busy"]
    assert "pid 11 on node-a was not traced" in res.errors[0].message


def test_timeout_names_process_path_and_cause(rpc_server, tmp_path):
    procs = [{"pid": 11, "rank": 0}, {"pid": 12, "rank": 1}, {"pid": 13, "rank": 2}, {"pid": 14, "rank": 3}]
    status = {
        11: {"delivered": False},  # never polled
        12: {"delivered": True},  # picked up, nothing written
        13: {"delivered": True, "alive": False},  # died
        14: {"delivered": False, "alive": False},
    }
    srv = fake_daemon(rpc_server, "node-a", tmp_path, procs, status)
    res = trigger_trace(
        TraceRequest(
            [parse_host(srv.address)],
            Target(all=True),
            TraceOptions(iterations=10),
            output_dir=str(tmp_path),
            trace_id="t-2",
        )
    )
    res = wait_for_trace(res, timeout=0.3, poll_interval=0.05)
    msgs = {e.pid: e.message for e in res.errors}
    # a process the daemon reports dead cannot deliver any more: "exited", not a timeout
    assert {e.pid: e.kind for e in res.errors} == {11: "timeout", 12: "timeout", 13: "exited", 14: "exited"}
    path11 = str(tmp_path / "t-2" / "rank-0_11.pt.trace.json")
    assert msgs[11].startswith(f"pid 11 (rank 0) on {srv.address}: {path11} did not appear within 0.3 s")
    assert "never picked up the trace config, so it is not polling the daemon" in msgs[11]
    assert "the traced iterations were not reached" in msgs[12]
    assert "exited before the trace was written" in msgs[13]
    assert "exited before it picked up the trace config" in msgs[14]
    assert all(e.path for e in res.errors)


def test_incomplete_file_is_not_done(rpc_server, tmp_path):
    srv = fake_daemon(rpc_server, "localhost", tmp_path, [{"pid": 11, "rank": 0}], {11: {"complete": False}})
    res = trigger_trace(
        TraceRequest(
            [parse_host(srv.address)],
            Target(all=True),
            TraceOptions(duration_ms=100),
            output_dir=str(tmp_path),
        )
    )
    write_trace(res.files[0].path, b'{"traceEvents": [')  # truncated
    res = wait_for_trace(res, timeout=0.3, poll_interval=0.05)
    assert [e.kind for e in res.errors] == ["timeout"]
    assert "exists (17 bytes) but is not complete JSON" in res.errors[0].message


def test_local_file_check_completes_when_daemon_lags(rpc_server, tmp_path):
    # The daemon has not noticed the file yet; the trigger on the same host checks it itself.
    srv = fake_daemon(
        rpc_server,
        "localhost",
        tmp_path,
        [{"pid": 11, "rank": 0}],
        {11: {"complete": False, "exists": False}},
    )
    res = trigger_trace(
        TraceRequest(
            [parse_host(srv.address)],
            Target(all=True),
            TraceOptions(duration_ms=100),
            output_dir=str(tmp_path),
        )
    )
    write_trace(res.files[0].path)
    res = wait_for_trace(res, timeout=5, poll_interval=0.05)
    assert res.ok, res.errors


def test_undelivered_cause_uses_the_process_list(rpc_server, tmp_path):
    procs = [{"pid": 11, "rank": 0}, {"pid": 12, "rank": 1}, {"pid": 13, "rank": 2}, {"pid": 14, "rank": 3}]
    listing = [
        {"pid": 11, "last_poll_s_ago": 30.0, "tracing": False},
        {"pid": 12, "last_poll_s_ago": 0.4, "tracing": True},
        {"pid": 13, "last_poll_s_ago": 0.4, "tracing": False},
    ]  # 14 is not registered any more
    status = {p["pid"]: {"delivered": False} for p in procs}
    srv = fake_daemon(rpc_server, "node-a", tmp_path, procs, status, listing=listing)
    res = trigger_trace(
        TraceRequest(
            [parse_host(srv.address)],
            Target(all=True),
            TraceOptions(duration_ms=100),
            output_dir=str(tmp_path),
        )
    )
    res = wait_for_trace(res, timeout=0.2, poll_interval=0.05)
    msgs = {e.pid: e.message for e in res.errors}
    assert "its last poll was 30 s ago, so it has stopped polling the daemon" in msgs[11]
    assert "still busy with an earlier trace" in msgs[12]
    assert "polls the daemon (last poll 0.4 s ago) but has not picked up the trace config yet" in msgs[13]
    assert "is no longer registered with the daemon" in msgs[14]


def test_duration_wait_shorter_than_kineto_needs(rpc_server, tmp_path):
    srv = fake_daemon(rpc_server, "node-a", tmp_path, [{"pid": 11, "rank": 0}], {11: {"delivered": True}})
    res = trigger_trace(
        TraceRequest(
            [parse_host(srv.address)],
            Target(all=True),
            TraceOptions(duration_ms=2000),
            output_dir=str(tmp_path),
        )
    )
    res = wait_for_trace(res, timeout=0.2, poll_interval=0.05)
    assert "a duration trace needs about 8 s (Kineto waits 5 s before it starts" in res.errors[0].message


def test_unwritable_manifest_is_a_note_not_a_failure(rpc_server, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    srv = fake_daemon(rpc_server, "node-a", blocker, [{"pid": 11, "rank": 0}])
    res = trigger_trace(
        TraceRequest([parse_host(srv.address)], Target(all=True), TraceOptions(duration_ms=100))
    )
    assert res.ok and res.manifest_paths == []
    assert any("could not write manifest.json into" in n for n in res.notes)


def _listed(pid: int, job: str = "7", **extra) -> dict:
    # registered 30 s ago, 30 polls: a 1 s poll interval
    return {"pid": pid, "pids": [pid, 1], "job_id": job, "registered_s_ago": 30.0, "polls": 30, **extra}


def test_iteration_trace_of_several_processes_is_aligned_by_default(rpc_server, tmp_path):
    from kinetoscope.collect.trigger import align_roundup, nice_ceil

    assert [nice_ceil(v) for v in (0.5, 1, 3, 7, 150, 200, 201)] == [1, 1, 5, 10, 200, 200, 500]
    assert align_roundup(1.0) == 200 and align_roundup(5.0) == 1000  # 10 x 10 steps/s x (poll + 0.5 s)
    procs = [{"pid": 11, "rank": 0, "job_id": "7"}, {"pid": 12, "rank": 1, "job_id": "7"}]
    listing = [_listed(11), _listed(12), _listed(1, is_launcher=True)]
    srv = fake_daemon(rpc_server, "node-a", tmp_path, procs, listing=listing)
    res = trigger_trace(
        TraceRequest(
            [parse_host(srv.address)],
            Target(job_id=7),
            TraceOptions(iterations=5),
            output_dir=str(tmp_path),
            trace_id="t-al",
        )
    )
    (req,) = [r for r in srv.requests if r["fn"] == "kscopeTrace"]
    assert req["iteration_roundup"] == 200 and res.options.iteration_roundup == 200
    assert res.notes == [
        "aligning 2 processes: each starts at the next multiple of 200 iterations (--iteration-roundup 200, from "
        "their 1 s poll interval), so every rank traces the same steps; this waits up to 200 steps first. "
        "--no-align starts each at its next step"
    ]
    assert read_manifest(tmp_path / "t-al").request["options"]["iteration_roundup"] == 200


def test_alignment_is_overridable_and_skipped_for_one_process(rpc_server, tmp_path):
    procs = [{"pid": 11, "rank": 0, "job_id": "7"}, {"pid": 12, "rank": 1, "job_id": "7"}]
    srv = fake_daemon(rpc_server, "node-a", tmp_path, procs, listing=[_listed(11), _listed(12)])
    host = [parse_host(srv.address)]
    cases = [
        (Target(job_id=7), TraceOptions(iterations=5, align=False), 1),  # --no-align
        (Target(job_id=7), TraceOptions(iterations=5, iteration_roundup=50), 50),  # explicit
        (Target(pids=(11,)), TraceOptions(iterations=5), 1),  # one process: nothing to align
    ]
    for i, (target, options, expected) in enumerate(cases):
        res = trigger_trace(TraceRequest(host, target, options, output_dir=str(tmp_path), trace_id=f"t-o{i}"))
        req = [r for r in srv.requests if r["fn"] == "kscopeTrace"][-1]
        assert req["iteration_roundup"] == expected, (i, req)
        assert not any(n.startswith("aligning") for n in res.notes)


def test_stalled_duration_trace_is_reported_without_waiting_out_the_timeout(rpc_server, tmp_path):
    """The daemon's view of issue 10's lost rank: picked up 20 s ago, Kineto's .tmp still empty,
    process alive and polling. Others: no .tmp at all; a .tmp with bytes (being written: waited for)."""
    procs = [{"pid": 11, "rank": 0}, {"pid": 12, "rank": 1}, {"pid": 13, "rank": 2}, {"pid": 14, "rank": 3}]
    picked = {"delivered": True, "delivered_s_ago": 20.0, "last_poll_s_ago": 0.4}
    status = {
        11: {**picked, "writing": True, "tmp_bytes": 0},  # the reported symptom
        12: {**picked, "writing": False},  # Kineto never started it
        13: {**picked, "writing": True, "tmp_bytes": 0, "last_poll_s_ago": 19.0},  # hung process
        14: {**picked, "writing": True, "tmp_bytes": 4096},  # being written
    }
    srv = fake_daemon(rpc_server, "node-a", tmp_path, procs, status)
    res = trigger_trace(
        TraceRequest(
            [parse_host(srv.address)],
            Target(all=True),
            TraceOptions(duration_ms=500),
            output_dir=str(tmp_path),
            trace_id="t-st",
        )
    )
    res = wait_for_trace(res, timeout=2, poll_interval=0.05)
    kinds = {e.pid: e.kind for e in res.errors}
    assert kinds == {11: "stalled", 12: "stalled", 13: "stalled", 14: "timeout"}
    msgs = {e.pid: e.message for e in res.errors}
    path11 = str(tmp_path / "t-st" / "rank-0_11.pt.trace.json")
    assert msgs[11].startswith(f"pid 11 (rank 0) on {srv.address}: {path11} was not written 1")  # 14.5 s
    assert (
        msgs[11]
        .split(" s after", 1)[1]
        .startswith(
            " its 500 ms "
            "window should have ended: Kineto created rank-0_11.pt.trace.json.tmp (0 bytes) but "
            "never wrote the trace, although the process is alive and polling: Kineto dropped "
            "the request (torch 2.13 logs 'Not starting tracing - insufficient time for warmup'"
        )
    )
    assert "Trace again, preferably with --iterations N" in msgs[11]
    assert "Kineto never started the trace (no rank-1_12.pt.trace.json.tmp)" in msgs[12]
    assert "then stopped polling the daemon 19 s ago" in msgs[13]
    assert "did not appear within 2 s" in msgs[14]


def test_iteration_trace_is_never_called_stalled(rpc_server, tmp_path):
    status = {
        11: {
            "delivered": True,
            "delivered_s_ago": 60.0,
            "last_poll_s_ago": 0.4,
            "writing": True,
            "tmp_bytes": 0,
        }
    }
    srv = fake_daemon(rpc_server, "node-a", tmp_path, [{"pid": 11, "rank": 0}], status)
    res = trigger_trace(
        TraceRequest(
            [parse_host(srv.address)], Target(all=True), TraceOptions(iterations=5), output_dir=str(tmp_path)
        )
    )
    res = wait_for_trace(res, timeout=0.5, poll_interval=0.05)
    assert [e.kind for e in res.errors] == ["timeout"]  # it waits for optimizer steps: nothing to judge
