"""The IPC fabric over real AF_UNIX datagram sockets (docs/protocol.md §1-2)."""

from __future__ import annotations

import os
import random
import socket
import struct
import time
import uuid

import pytest
from daemon_helpers import IpcClient, rpc

from kinetoscope.protocol import wire


def _trigger(port: int, pids: list[int], config: str, job_id: int = 0, limit: int = 3) -> dict:
    return rpc(
        port,
        {
            "fn": "setKinetOnDemandRequest",
            "config": config,
            "job_id": job_id,
            "pids": pids,
            "process_limit": limit,
        },
    )


def _config(root: str, name: str = "t.json") -> str:
    return f"ACTIVITIES_LOG_FILE={root}/{name}\nPROFILE_START_TIME=0\nACTIVITIES_DURATION_MSECS=500"


def test_filesystem_socket_is_world_writable_and_unlinked_on_stop(make_daemon, sockdir):
    d = make_daemon()
    path = os.path.join(sockdir, "dynolog")
    assert os.stat(path).st_mode & 0o777 == 0o666
    d.stop()
    assert not os.path.exists(path)


def test_poll_registers_and_empty_reply_has_exact_header(daemon, clients):
    c = clients()
    c.send(wire.pack_request(3, 4242, [25786, 25784]))
    reply = c.recv()
    assert reply == (b"req", b"")
    procs = rpc(daemon.rpc_port, {"fn": "kscopeListProcesses"})["processes"]
    assert [(p["pid"], p["pids"], p["job_id"]) for p in procs] == [(25786, [25786, 25784], "4242")]


def test_one_shot_delivery_with_trace_id_and_trailing_newline(daemon, clients, trace_root):
    c = clients()
    assert c.poll([1001]) == ""
    res = _trigger(daemon.rpc_port, [1001], _config(trace_root))
    assert res["activityProfilersTriggered"] == [1001]
    got = c.poll([1001])
    assert got is not None and got.startswith("\n    " + _config(trace_root) + "\n    REQUEST_TRACE_ID=")
    assert got.endswith("\n") and got.count("\n") == 5
    trace_id = got.rstrip("\n").rsplit("=", 1)[1]
    assert trace_id.isdigit()
    assert c.poll([1001]) == ""  # one-shot


@pytest.mark.parametrize("busy_type", [0, 1])
def test_only_activities_bit_releases_the_config(daemon, clients, trace_root, busy_type):
    c = clients()
    c.poll([1002])
    _trigger(daemon.rpc_port, [1002], _config(trace_root))
    # torch 2.13 polls with type 1 while tracing (kineto HEAD: 0): the config stays queued.
    assert c.poll([1002], config_type=busy_type) == ""
    assert c.poll([1002], config_type=busy_type) == ""
    # Any value with bit 2 releases it: 2 (kineto HEAD idle), 3 (torch 2.13 idle), odd ones too.
    assert c.poll([1002], config_type=2 | 64).startswith("\n    ACTIVITIES_LOG_FILE=")


def test_type_3_and_type_2_both_receive(daemon, clients, trace_root):
    a, b = clients(), clients()
    a.poll([1003])
    b.poll([1004])
    _trigger(daemon.rpc_port, [1003, 1004], _config(trace_root))
    assert a.poll([1003], config_type=3).startswith("\n    ")
    assert b.poll([1004], config_type=2).startswith("\n    ")


def test_busy_means_pending_not_picked_up(daemon, clients, trace_root):
    c = clients()
    c.poll([1005])
    first = _trigger(daemon.rpc_port, [1005], _config(trace_root))
    second = _trigger(daemon.rpc_port, [1005], _config(trace_root))
    assert first["activityProfilersTriggered"] == [1005]
    assert second == {
        "activityProfilersBusy": 1,
        "activityProfilersTriggered": [],
        "eventProfilersBusy": 0,
        "eventProfilersTriggered": [],
        "processesMatched": [1005],
    }


def test_processes_keyed_by_job_and_pid_set(daemon, clients):
    a = clients()
    a.poll([10, 5], job_id=1)
    a.poll([5, 10], job_id=1)  # same set: same process
    a.poll([10, 5], job_id=2)  # other job: another process
    a.poll([10], job_id=1)  # other set: another process
    procs = rpc(daemon.rpc_port, {"fn": "kscopeListProcesses"})["processes"]
    assert sorted((p["job_id"], tuple(sorted(p["pids"]))) for p in procs) == [
        ("1", (5, 10)),
        ("1", (10,)),
        ("2", (5, 10)),
    ]
    only1 = rpc(daemon.rpc_port, {"fn": "kscopeListProcesses", "job_id": 1})["processes"]
    assert {p["job_id"] for p in only1} == {"1"}


def test_ctxt_counts_distinct_pids_per_job_and_gpu(daemon, clients):
    c = clients()

    def ctxt(gpu: int, pid: int, job: int) -> int:
        c.send(wire.pack_context(gpu, pid, job))
        msg_type, payload = c.recv()
        assert msg_type == b"ctxt" and len(payload) == 4
        return struct.unpack("=i", payload)[0]

    assert ctxt(0, 100, 7) == 1
    assert ctxt(0, 101, 7) == 2
    assert ctxt(0, 100, 7) == 2  # same pid again
    assert ctxt(1, 100, 7) == 1  # other gpu
    assert ctxt(0, 100, 8) == 1  # other job


def test_type_compared_by_prefix(daemon, clients):
    c = clients()
    c.send(wire.pack_datagram(b"request", wire.REQ_HEADER.pack(3, 1, 0) + wire.PID.pack(1006)))
    assert c.recv() == (b"req", b"")


def test_no_reply_for_n_zero(daemon, clients):
    c = clients()
    c.send(wire.pack_request(3, 0, []))
    assert c.recv(timeout=0.3) is None
    assert c.poll([1007]) == ""  # still serving


def test_gc_forgets_processes_that_stop_polling(make_daemon, sockdir, trace_root):
    d = make_daemon(gc_timeout_s=0.4)
    c = IpcClient(d.ipc.endpoint.address, sockdir)
    try:
        c.poll([2001])
        c.poll([2002])
        _trigger(d.rpc_port, [2001], _config(trace_root))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            c.poll([2002])  # 2002 keeps polling, 2001 does not
            pids = [p["pid"] for p in rpc(d.rpc_port, {"fn": "kscopeListProcesses"})["processes"]]
            if pids == [2002]:
                break
            time.sleep(0.1)
        assert pids == [2002]
        # The pending config was dropped with it: re-registering starts clean.
        assert c.poll([2001]) == ""
    finally:
        c.close()


def test_drains_a_burst_of_queued_datagrams(daemon, clients):
    """Many clients send at once; every one gets exactly one reply within the client window."""
    cs = [clients() for _ in range(40)]
    for i, c in enumerate(cs):
        for _attempt in range(50):  # the kernel queue (max_dgram_qlen) may be full: retry like kineto
            try:
                c.sock.setblocking(False)
                c.send(wire.pack_request(3, 0, [3000 + i]))
                break
            except BlockingIOError:
                time.sleep(0.01)
    for i, c in enumerate(cs):
        assert c.recv(timeout=2.0) == (b"req", b""), i
        assert c.recv(timeout=0.01) is None  # exactly once
    assert len(rpc(daemon.rpc_port, {"fn": "kscopeListProcesses"})["processes"]) == 40


def test_many_queued_from_one_client_all_answered(daemon, clients):
    c = clients()
    n = 8  # below the smallest max_dgram_qlen (10)
    for i in range(n):
        c.send(wire.pack_request(3, 0, [4000 + i]))
    replies = [c.recv(timeout=2.0) for _ in range(n)]
    assert replies == [(b"req", b"")] * n


def test_vanished_client_does_not_break_the_loop(daemon, clients, sockdir):
    gone = IpcClient(daemon.ipc.endpoint.address, sockdir)
    gone.send(wire.pack_request(3, 0, [5000]))
    gone.close()  # socket closed and unlinked before the reply can be delivered
    unbound = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        unbound.sendto(wire.pack_request(3, 0, [5001]), daemon.ipc.endpoint.address)  # no address to reply to
    finally:
        unbound.close()
    assert clients().poll([5002]) == ""


@pytest.mark.parametrize(
    "datagram",
    [
        b"",
        b"req",
        b"\x00" * 39,
        wire.METADATA.pack(16, b"req"),  # header says 16, carries 0
        wire.METADATA.pack(4, b"req") + b"\x00" * 16,  # carries more than it says
        wire.pack_datagram(b"req", b"\x01\x02"),  # payload shorter than the req header
        wire.pack_datagram(b"req", wire.REQ_HEADER.pack(3, 5, 0) + wire.PID.pack(1)),  # n=5, one pid
        wire.pack_datagram(b"req", wire.REQ_HEADER.pack(3, -1, 0)),
        wire.pack_datagram(b"req", wire.REQ_HEADER.pack(3, 1 << 30, 0)),
        wire.pack_datagram(b"ctxt", b"\x00" * 3),
        wire.pack_datagram(b"xyz", b"hello"),
        wire.METADATA.pack(1 << 63, b"req"),
        random.Random(1778).randbytes(40 + 16 + 4),  # fixed: reproducible ids, xdist-safe
        b"\xff" * 5000,  # oversized
        wire.pack_datagram(b"req", b"\x00" * 60000),  # oversized, consistent header
    ],
)
def test_garbage_is_dropped_and_service_continues(daemon, clients, datagram):
    bad = clients()
    bad.send(datagram)
    assert bad.recv(timeout=0.1) is None
    assert clients().poll([6000]) == ""


def test_dropped_datagrams_are_counted(daemon, clients):
    c = clients()
    c.send(b"short")
    c.send(b"\xff" * 3000)
    c.send(wire.pack_datagram(b"zzz", b""))
    assert c.poll([6001]) == ""
    samples = {
        s.labels["reason"]: s.value
        for m in daemon.metrics.registry.collect()
        if m.name == "kscope_daemon_ipc_dropped_datagrams"
        for s in m.samples
        if s.name.endswith("_total")
    }
    assert samples == {"malformed": 1.0, "oversized": 1.0, "unknown_type": 1.0}


def test_abstract_socket_mode_with_private_name(make_daemon):
    name = f"kscope-test-{uuid.uuid4().hex[:12]}"
    d = make_daemon(ipc_socket_dir=None, ipc_name=name)
    assert d.ipc.endpoint.address == b"\0" + name.encode() + b"\0"
    c = IpcClient(d.ipc.endpoint.address, None)
    try:
        assert c.poll([7000], job_id=9) == ""
        assert rpc(d.rpc_port, {"fn": "kscopeListProcesses"})["processes"][0]["pid"] == 7000
    finally:
        c.close()


def test_second_daemon_on_same_abstract_name_fails_clearly(make_daemon):
    from kinetoscope.errors import KinetoscopeError

    name = f"kscope-test-{uuid.uuid4().hex[:12]}"
    make_daemon(ipc_socket_dir=None, ipc_name=name)
    with pytest.raises(KinetoscopeError, match="already in use"):
        make_daemon(ipc_socket_dir=None, ipc_name=name)
