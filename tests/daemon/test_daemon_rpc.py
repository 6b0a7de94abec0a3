"""The dyno-compatible RPC server over real TCP (docs/protocol.md §3), bad input, auth, trace-root rules."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import time

import orjson
import pytest
from daemon_helpers import IpcClient, rpc, rpc_raw

from kinetoscope.daemon.handlers import VERSION
from kinetoscope.protocol import wire

# Captured from the real `dyno gputrace --log-file /tmp/x/trace.json` (docs/protocol.md §3.3).
DYNO_GPUTRACE_BODY = (
    b'\n{\n    "fn": "setKinetOnDemandRequest",\n    "config": "ACTIVITIES_LOG_FILE=/tmp/x/trace.json'
    b"\\nPROFILE_START_TIME=0\\nACTIVITIES_DURATION_MSECS=500\\nPROFILE_REPORT_INPUT_SHAPES=false"
    b"\\nPROFILE_WITH_STACK=false\\nPROFILE_WITH_FLOPS=false\\nPROFILE_WITH_MODULES=false"
    b'",\n    "job_id": 0,\n    "pids": [0],\n    "process_limit": 3\n}'
)
DYNO_GPUTRACE_FRAME = b"\x41\x01\x00\x00" + DYNO_GPUTRACE_BODY
DYNO_143 = (
    b'{"activityProfilersBusy":0,"activityProfilersTriggered":[111],"eventProfilersBusy":0,'
    b'"eventProfilersTriggered":[],"processesMatched":[111,222]}'
)
EMPTY_DYNO = {
    "activityProfilersBusy": 0,
    "activityProfilersTriggered": [],
    "eventProfilersBusy": 0,
    "eventProfilersTriggered": [],
    "processesMatched": [],
}


def _get_status_ok(port: int) -> None:
    assert rpc_raw(port, b"\x12\x00\x00\x00" + b'{"fn":"getStatus"}') == b'{"status":1}'


# ------------------------------------------------------------------------ byte-exact dyno
def test_status_and_version_bytes(daemon):
    port = daemon.rpc_port
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"\x12\x00\x00\x00" + b'{"fn":"getStatus"}')
        assert s.recv(100) == b"\x0c\x00\x00\x00" + b'{"status":1}'
    body = b'{"fn":"getVersion"}'
    expected = b'{"version":"' + VERSION.encode() + b'"}'
    assert rpc_raw(port, struct.pack("=i", len(body)) + body) == expected
    assert VERSION.startswith("0.6.0+")


def test_dcgm_functions_answer_false_without_dcgm(daemon):
    port = daemon.rpc_port
    pause = b'\n{\n    "fn": "dcgmProfPause",\n    "duration_s": 60\n}'
    assert rpc_raw(port, wire.frame_rpc(pause)) == b'{"status":false}'
    assert rpc_raw(port, wire.frame_rpc(b'{"fn":"dcgmProfResume"}')) == b'{"status":false}'
    assert rpc(port, {"fn": "dcgmProfPause"})["status"] == "failed"


@pytest.fixture()
def tmp_x_root():
    """The captured request writes to /tmp/x: use it as the trace root, remove it if we made it."""
    existed = os.path.exists("/tmp/x")
    yield "/tmp/x"
    if not existed:
        shutil.rmtree("/tmp/x", ignore_errors=True)


def test_dyno_gputrace_request_bytes_give_the_143_byte_response(make_daemon, sockdir, tmp_x_root):
    d = make_daemon(trace_root=tmp_x_root)
    child = IpcClient(d.ipc.endpoint.address, sockdir)
    launcher = IpcClient(d.ipc.endpoint.address, sockdir)
    try:
        assert launcher.poll([222]) == ""
        assert child.poll([111, 222]) == ""  # 222 is 111's parent: a launcher
        assert len(DYNO_GPUTRACE_BODY) == 321
        with socket.create_connection(("127.0.0.1", d.rpc_port), timeout=5) as s:
            s.sendall(DYNO_GPUTRACE_FRAME)
            header = s.recv(4, socket.MSG_WAITALL)
            body = s.recv(1000, socket.MSG_WAITALL)
        assert header == b"\x8f\x00\x00\x00" and len(body) == 143
        assert body == DYNO_143
        cfg = child.poll([111, 222])
        assert cfg.startswith(
            "\n    ACTIVITIES_LOG_FILE=/tmp/x/trace.json\nPROFILE_START_TIME=0\nACTIVITIES_DURATION_MSECS=500"
            "\nPROFILE_REPORT_INPUT_SHAPES=false\nPROFILE_WITH_STACK=false\nPROFILE_WITH_FLOPS=false"
            "\nPROFILE_WITH_MODULES=false\n    REQUEST_TRACE_ID="
        )
        assert launcher.poll([222]) == ""  # launchers are not targets by default
    finally:
        child.close()
        launcher.close()


# ------------------------------------------------------------------------ matching semantics
def _gputrace(port: int, root: str, pids: list[int], limit: int = 3, job_id: int = 0) -> dict:
    return rpc(
        port,
        {
            "fn": "setKinetOnDemandRequest",
            "config": f"ACTIVITIES_LOG_FILE={root}/t.json\nPROFILE_START_TIME=0",
            "job_id": job_id,
            "pids": pids,
            "process_limit": limit,
        },
    )


@pytest.fixture()
def torchrun_like(clients):
    """A launcher (500, parent 400) with three ranks 501-503 (docs/protocol.md §2.3 map order)."""
    cs = {}
    for pids in ([500, 400], [501, 500, 400], [502, 500, 400], [503, 500, 400]):
        c = clients()
        assert c.poll(pids) == ""
        cs[pids[0]] = (c, pids)
    return cs


def test_limit_counts_ranks_not_launchers(daemon, torchrun_like, trace_root):
    res = _gputrace(daemon.rpc_port, trace_root, [0], limit=3)
    assert res["processesMatched"] == [500, 501, 502, 503]
    assert res["activityProfilersTriggered"] == [501, 502, 503]
    c, pids = torchrun_like[500]
    assert c.poll(pids) == ""


def test_trace_launchers_option_restores_dynolog_behaviour(make_daemon, sockdir, trace_root):
    d = make_daemon(include_launchers=True)
    cs = []
    try:
        for pids in ([500, 400], [501, 500, 400], [502, 500, 400], [503, 500, 400]):
            cs.append(IpcClient(d.ipc.endpoint.address, sockdir))
            cs[-1].poll(pids)
        res = _gputrace(d.rpc_port, trace_root, [0], limit=3)
        assert res["processesMatched"] == [500, 501, 502, 503]
        assert res["activityProfilersTriggered"] == [500, 501, 502]
    finally:
        for c in cs:
            c.close()


def test_ancestor_pid_matches_descendants(daemon, torchrun_like, trace_root):
    res = _gputrace(daemon.rpc_port, trace_root, [400], limit=-1)  # negative = unlimited
    assert res["processesMatched"] == [500, 501, 502, 503]
    assert res["activityProfilersTriggered"] == [501, 502, 503]
    res = _gputrace(daemon.rpc_port, trace_root, [502, 999])
    assert res["processesMatched"] == [502] and res["activityProfilersBusy"] == 1


def test_limit_zero_and_unknown_job(daemon, torchrun_like, trace_root):
    res = _gputrace(daemon.rpc_port, trace_root, [0], limit=0)
    assert res["activityProfilersTriggered"] == [] and res["processesMatched"] == [500, 501, 502, 503]
    assert _gputrace(daemon.rpc_port, trace_root, [0], job_id=77) == EMPTY_DYNO


def test_limit_one_then_busy_does_not_consume_limit(daemon, torchrun_like, trace_root):
    assert _gputrace(daemon.rpc_port, trace_root, [0], limit=1)["activityProfilersTriggered"] == [501]
    res = _gputrace(daemon.rpc_port, trace_root, [0], limit=1)
    assert res["activityProfilersBusy"] == 1 and res["activityProfilersTriggered"] == [502]


# ------------------------------------------------------------------------ bad input
BAD_FRAMES = [
    pytest.param(struct.pack("=i", -5), id="negative-length"),
    pytest.param(struct.pack("=i", 0), id="zero-length"),
    pytest.param(struct.pack("=i", 2**31 - 1) + b"{", id="huge-length"),
    pytest.param(wire.frame_rpc(b"{not json"), id="bad-json"),
    pytest.param(wire.frame_rpc(b"\xff\xfe"), id="not-utf8"),
    pytest.param(wire.frame_rpc(b"[1,2]"), id="array"),
    pytest.param(wire.frame_rpc(b"42"), id="number"),
    pytest.param(wire.frame_rpc(b'"getStatus"'), id="string"),
    pytest.param(wire.frame_rpc(b"{}"), id="no-fn"),
    pytest.param(wire.frame_rpc(b'{"fn": 3}'), id="fn-not-string"),
    pytest.param(wire.frame_rpc(b'{"fn": "rm -rf"}'), id="unknown-fn"),
    pytest.param(wire.frame_rpc(b'{"fn": "dcgmProfPause", "duration_s": "x"}'), id="dcgm-bad-type"),
    pytest.param(wire.frame_rpc(b'{"fn": "kscopeTrace"}'), id="kscope-no-trace-id"),
    pytest.param(wire.frame_rpc(b'{"fn": "kscopeTrace", "trace_id": "../x"}'), id="kscope-bad-trace-id"),
    pytest.param(
        wire.frame_rpc(b'{"fn": "kscopeTrace", "trace_id": "a", "pids": "1"}'), id="kscope-pids-type"
    ),
    pytest.param(
        wire.frame_rpc(b'{"fn": "kscopeTrace", "trace_id": "a", "duration_ms": true}'), id="kscope-bool-int"
    ),
    pytest.param(wire.frame_rpc(b'{"fn": "kscopeListProcesses", "job_id": [1]}'), id="list-job-type"),
    pytest.param(wire.frame_rpc(b'{"fn": "kscopeTraceStatus", "trace_id": 5}'), id="status-type"),
]


@pytest.mark.parametrize("frame", BAD_FRAMES)
def test_bad_frames_get_an_error_and_the_server_keeps_serving(daemon, frame):
    reply = orjson.loads(rpc_raw(daemon.rpc_port, frame))
    assert reply["status"] == "failed" and reply["error"]
    _get_status_ok(daemon.rpc_port)


def test_short_frame_then_half_close_gets_an_error(daemon):
    with socket.create_connection(("127.0.0.1", daemon.rpc_port), timeout=5) as s:
        s.sendall(struct.pack("=i", 100) + b'{"fn":')
        s.shutdown(socket.SHUT_WR)
        reply = orjson.loads(wire.read_rpc_frame(s))
    assert reply["status"] == "failed" and "closed" in reply["error"]
    _get_status_ok(daemon.rpc_port)


@pytest.mark.parametrize(
    "fields, status",
    [
        ({"pids": [0]}, "failed"),
        ({"config": "X=1"}, "failed"),
        ({"config": "X=1", "pids": ["a"]}, "failed with exception"),
        ({"config": "X=1", "pids": [0], "job_id": "x"}, "failed with exception"),
        ({"config": 5, "pids": [0]}, "failed with exception"),
        ({"config": "X=1", "pids": [0], "process_limit": "3"}, "failed with exception"),
        ({"config": "X=1", "pids": 7}, "failed with exception"),
    ],
)
def test_dyno_field_errors_keep_dynos_status_and_add_empty_results(daemon, fields, status):
    reply = rpc(daemon.rpc_port, {"fn": "setKinetOnDemandRequest", **fields})
    assert reply["status"].startswith(status) and reply["error"]
    assert {k: reply[k] for k in EMPTY_DYNO} == EMPTY_DYNO  # so the real dyno CLI prints instead of panicking
    _get_status_ok(daemon.rpc_port)


def test_dyno_unescaped_log_file_gets_dyno_shaped_error(daemon):
    # `dyno gputrace --log-file '/tmp/a"b.json'` produces invalid JSON (docs/protocol.md §4.2).
    body = b'\n{\n    "fn": "setKinetOnDemandRequest",\n    "config": "ACTIVITIES_LOG_FILE=/tmp/a"b.json",\n    "pids": [0]\n}'
    reply = orjson.loads(rpc_raw(daemon.rpc_port, wire.frame_rpc(body)))
    assert reply["status"] == "failed" and reply["processesMatched"] == []


def test_stuck_client_does_not_block_others(make_daemon):
    d = make_daemon(rpc_timeout_s=1.0)
    stuck = socket.create_connection(("127.0.0.1", d.rpc_port), timeout=5)
    half = socket.create_connection(("127.0.0.1", d.rpc_port), timeout=5)
    try:
        half.sendall(b"\x40\x00")  # half a length prefix
        t0 = time.monotonic()
        _get_status_ok(d.rpc_port)
        assert time.monotonic() - t0 < 0.9  # served while both others are still pending
        reply = orjson.loads(wire.read_rpc_frame(stuck))  # then the stuck one times out, with an answer
        assert reply["status"] == "failed" and "timed out" in reply["error"]
    finally:
        stuck.close()
        half.close()
    _get_status_ok(d.rpc_port)


def test_many_concurrent_connections(daemon):
    socks = [socket.create_connection(("127.0.0.1", daemon.rpc_port), timeout=5) for _ in range(20)]
    try:
        for s in socks:
            s.sendall(wire.frame_rpc(b'{"fn":"getStatus"}'))
        assert [wire.read_rpc_frame(s) for s in socks] == [b'{"status":1}'] * 20
    finally:
        for s in socks:
            s.close()


# ------------------------------------------------------------------------ token
def test_token_required_on_every_request(make_daemon, trace_root):
    d = make_daemon(token="s3cret")
    port = d.rpc_port
    for req in ({"fn": "getStatus"}, {"fn": "getStatus", "token": "nope"}, {"fn": "getStatus", "token": 1}):
        reply = rpc(port, req)
        assert reply["status"] == "failed" and "unauthorized" in reply["error"]
    assert rpc(port, {"fn": "getStatus", "token": "s3cret"}) == {"status": 1}
    reply = rpc(port, {"fn": "setKinetOnDemandRequest", "config": "X=1", "pids": [0]})
    assert "unauthorized" in reply["error"] and reply["processesMatched"] == []
    assert rpc(port, {"fn": "kscopeListProcesses", "token": "s3cret"})["processes"] == []


# ------------------------------------------------------------------------ trace root
@pytest.mark.parametrize(
    "log_file, why",
    [
        ("/etc/cron.d/evil.json", "outside"),
        ("{root}/../escape.json", ".."),
        ("{root}/a/../../escape.json", ".."),
        ("relative/trace.json", "not absolute"),
        ("{root}", "file under"),
        ("{root}-sibling/t.json", "outside"),
        ("{root}/link/t.json", "symlink"),
    ],
)
def test_log_file_outside_trace_root_is_refused(daemon, clients, trace_root, log_file, why):
    os.makedirs(trace_root, exist_ok=True)
    if not os.path.lexists(os.path.join(trace_root, "link")):
        os.symlink("/etc", os.path.join(trace_root, "link"))
    c = clients()
    c.poll([8000])
    config = f"ACTIVITIES_LOG_FILE={log_file.format(root=trace_root)}\nPROFILE_START_TIME=0"
    reply = rpc(
        daemon.rpc_port, {"fn": "setKinetOnDemandRequest", "config": config, "pids": [0], "job_id": 0}
    )
    assert reply["status"] == "failed" and why in reply["error"]
    assert {k: reply[k] for k in EMPTY_DYNO} == EMPTY_DYNO
    assert c.poll([8000]) == ""  # nothing was queued


def test_second_log_file_line_is_checked_too(daemon, clients, trace_root):
    config = f"ACTIVITIES_LOG_FILE={trace_root}/ok.json\n  ACTIVITIES_LOG_FILE = /etc/x.json # later wins"
    reply = rpc(daemon.rpc_port, {"fn": "setKinetOnDemandRequest", "config": config, "pids": [0]})
    assert reply["status"] == "failed" and "outside" in reply["error"]


def test_missing_log_file_is_refused(daemon):
    reply = rpc(
        daemon.rpc_port, {"fn": "setKinetOnDemandRequest", "config": "PROFILE_START_TIME=0", "pids": [0]}
    )
    assert reply["status"] == "failed" and "ACTIVITIES_LOG_FILE" in reply["error"]


def test_past_start_time_is_refused(daemon, trace_root):
    past = int(time.time() * 1000) - 60_000
    config = f"ACTIVITIES_LOG_FILE={trace_root}/t.json\nPROFILE_START_TIME={past}"
    reply = rpc(daemon.rpc_port, {"fn": "setKinetOnDemandRequest", "config": config, "pids": [0]})
    assert reply["status"] == "failed" and "in the past" in reply["error"]
    future = int(time.time() * 1000) + 60_000
    config = f"ACTIVITIES_LOG_FILE={trace_root}/t.json\nPROFILE_START_TIME={future}"
    assert "status" not in rpc(
        daemon.rpc_port, {"fn": "setKinetOnDemandRequest", "config": config, "pids": [0]}
    )


def test_log_dir_is_created_inside_the_root(daemon, clients, trace_root):
    c = clients()
    c.poll([8100])
    config = f"ACTIVITIES_LOG_FILE={trace_root}/deep/er/t.json"
    reply = rpc(daemon.rpc_port, {"fn": "setKinetOnDemandRequest", "config": config, "pids": [8100]})
    assert reply["activityProfilersTriggered"] == [8100]
    assert os.path.isdir(os.path.join(trace_root, "deep", "er"))


# ------------------------------------------------------------------------ binding
def test_dual_stack_bind(make_daemon):
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    d = make_daemon(bind=["::"], insecure=True)  # every interface without a token: explicit opt-in
    _get_status_ok(d.rpc_port)  # IPv4 client on a v6 socket
    assert rpc(d.rpc_port, {"fn": "getStatus"}, host="::1") == {"status": 1}


def test_default_bind_is_loopback_only(daemon):
    assert {h for h, _p in daemon.rpc.addresses} <= {"127.0.0.1", "::1"}
