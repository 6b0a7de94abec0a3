"""Issue 32 (daemon part): what a traced process, a local user or a second daemon could still do.

Each test fails on the main branch before the fix (the FIFO one by hanging: pytest-timeout):
files planted at a trace path are neither followed nor read without bound and get a reason;
the trace root is pinned at start and refused when another user controls its directories; a
second daemon cannot take the IPC socket; registrations and listings are bounded; bad job ids,
trace ids with a newline, negative start times and wrong tokens get one clear, logged answer.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from daemon_helpers import IpcClient, rpc

from kinetoscope.daemon.auth_throttle import MAX_DELAY_S, STEP_S, AuthThrottle
from kinetoscope.daemon.daemon import Daemon
from kinetoscope.daemon.paths import PathRefused, check_root_chain
from kinetoscope.daemon.registry import Registry
from kinetoscope.errors import KinetoscopeError
from kinetoscope.protocol import tracefile
from kinetoscope.protocol.kineto_config import valid_trace_id
from kinetoscope.protocol.manifest import TRACE_ID_RE

REPO = Path(__file__).resolve().parents[2]


def _trace_one(d: Daemon, sockdir: str, trace_id: str) -> tuple[str, IpcClient]:
    """Register one process (pid 4242, this test's /proc) and trace it: its file's path."""
    c = IpcClient(d.ipc.endpoint.address, sockdir)
    assert c.poll([4242, 1], job_id=7) == ""
    res = rpc(d.rpc_port, {"fn": "kscopeTrace", "trace_id": trace_id, "all": True, "duration_ms": 100})
    assert res["status"] == "ok" and res["triggered"] == 1, res
    return res["matched"][0]["path"], c


def _status(d: Daemon, trace_id: str) -> dict:
    res = rpc(d.rpc_port, {"fn": "kscopeTraceStatus", "trace_id": trace_id})
    assert res["status"] == "ok", res
    return res["files"][0]


def _plant(kind: str, path: str, tmp: Path) -> str:
    """Put ``kind`` at ``path``; returns the reason the status should give (a substring)."""
    if kind == "fifo":
        os.mkfifo(path)
        return "not a regular file: fifo"
    if kind == "devzero":
        os.symlink("/dev/zero", path)
        return "symlink refused"
    if kind == "secret":  # an operator's 0600 JSON file, valid and "complete"
        secret = tmp / "secret.json"
        secret.write_text('{"traceEvents": [], "password": "hunter2"}')
        secret.chmod(0o600)
        os.symlink(secret, path)
        return "symlink refused"
    if kind == "hardlink":
        other = tmp / "other.json"
        other.write_text('{"traceEvents": []}')
        os.link(other, path)
        return "hard link refused"
    if kind == "directory":
        os.mkdir(path)
        return "not a regular file: directory"
    if kind == "socket":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        here = os.getcwd()
        os.chdir(os.path.dirname(path))  # a socket path must fit 108 bytes
        try:
            s.bind(os.path.basename(path))
        finally:
            os.chdir(here)
            s.close()
        return "not a regular file"
    raise AssertionError(kind)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["fifo", "devzero", "secret", "hardlink", "directory", "socket"])
def test_status_of_a_planted_file_names_why_it_is_not_read(make_daemon, sockdir, tmp_path, kind):
    d = make_daemon()
    path, c = _trace_one(d, sockdir, f"planted-{kind}")
    try:
        why = _plant(kind, path, tmp_path)
        f = _status(d, f"planted-{kind}")
        assert f["exists"] is True and f["complete"] is False, f
        assert why in (f["reason"] or ""), f
        # the per-host manifest records it too, and the daemon still serves everyone
        manifest = orjson.loads(Path(path).with_name("manifest.testhost.json").read_bytes())
        assert why in manifest["files"][0]["refused"]
        assert rpc(d.rpc_port, {"fn": "getStatus"}) == {"status": 1}
        assert c.poll([4242, 1], job_id=7) is not None
    finally:
        c.close()


@pytest.mark.timeout(120)
def test_many_status_calls_on_a_fifo_leave_the_workers_free(make_daemon, sockdir):
    """Before: each status call blocked a worker in open(); after 64, every call was 'busy'."""
    d = make_daemon(max_connections=4)
    path, c = _trace_one(d, sockdir, "fifo-many")
    try:
        os.mkfifo(path)
        for _ in range(12):
            assert "fifo" in _status(d, "fifo-many")["reason"]
        listed = rpc(d.rpc_port, {"fn": "kscopeListProcesses"})
        assert listed["status"] == "ok" and listed["total"] == 1
    finally:
        c.close()


@pytest.mark.timeout(120)
def test_huge_and_array_files_are_checked_with_bounded_reads(make_daemon, sockdir, monkeypatch):
    """A 1 GiB sparse file and 20 MiB of ``[{},{},...]``: only both ends are read (before: the
    whole file parsed when under 64 MiB, ~2 GB of RSS for 63 MiB of empty objects)."""
    read: list[int] = []
    real_pread = os.pread

    def counting_pread(fd: int, n: int, offset: int) -> bytes:
        data = real_pread(fd, n, offset)
        read.append(len(data))
        return data

    monkeypatch.setattr(tracefile.os, "pread", counting_pread)
    d = make_daemon()
    path, c = _trace_one(d, sockdir, "huge")
    try:
        with open(path, "wb") as f:
            f.truncate(1 << 30)
        f_status = _status(d, "huge")
        assert f_status["bytes"] == 1 << 30 and f_status["complete"] is False and f_status["reason"] is None
        assert sum(read) <= 2 * tracefile.END_BYTES + 2
        read.clear()
        os.unlink(path)
        with open(path, "wb") as f:
            f.write(b"[" + b"{}," * (7 << 20) + b"{}]")
        assert _status(d, "huge")["complete"] is False
        assert sum(read) <= 2 * tracefile.END_BYTES + 2
        read.clear()
        os.unlink(path)
        with open(path, "wb") as f:  # a whole object over the syntax-check limit: both ends
            f.write(b'{"traceEvents": [' + b"{}," * (7 << 20) + b"{}]}\n")
        assert _status(d, "huge")["complete"] is True
        assert sum(read) <= 2 * tracefile.END_BYTES + 2
    finally:
        c.close()


def test_a_gzip_bomb_at_a_trace_path_stops_at_the_inflate_limit(tmp_path, monkeypatch):
    import gzip

    monkeypatch.setattr(tracefile, "GZIP_CHECK_LIMIT", 1 << 20)
    bomb = tmp_path / "bomb_1.json"
    bomb.write_bytes(gzip.compress(b"{" + b" " * (8 << 20) + b"}"))
    assert tracefile.check_file(str(bomb)).complete is False
    small = tmp_path / "small_1.json"
    small.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    assert tracefile.check_file(str(small)).complete is True


# ------------------------------------------------------------------ the trace root
@pytest.mark.timeout(60)
def test_a_trace_root_swapped_for_a_symlink_after_start_is_refused(
    make_daemon, sockdir, trace_root, tmp_path
):
    d = make_daemon()
    c = IpcClient(d.ipc.endpoint.address, sockdir)
    try:
        assert c.poll([4242, 1], job_id=7) == ""
        victim = tmp_path / "victim"
        victim.mkdir()
        os.rename(trace_root, trace_root + ".orig")
        os.symlink(victim, trace_root)
        res = rpc(d.rpc_port, {"fn": "kscopeTrace", "trace_id": "swap", "all": True})
        assert res["status"] == "failed" and "changed since the daemon started" in res["error"], res
        config = f"ACTIVITIES_LOG_FILE={trace_root}/x/t.json\nACTIVITIES_DURATION_MSECS=100"
        res = rpc(d.rpc_port, {"fn": "setKinetOnDemandRequest", "config": config, "pids": [], "job_id": 7})
        assert "changed since the daemon started" in res["error"], res
        assert list(victim.iterdir()) == []  # nothing created or written there
    finally:
        c.close()


def test_a_trace_root_under_a_world_writable_directory_is_refused(make_daemon, tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # no sticky bit: anyone may rename what is inside
    with pytest.raises(KinetoscopeError, match="writable by every user"):
        make_daemon(trace_root=str(open_dir / "traces"))
    open_dir.chmod(0o1777)  # like /tmp: fine
    make_daemon(trace_root=str(open_dir / "traces"))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_trace_root_whose_parent_another_user_created_is_refused(make_daemon, tmp_path):
    """The default /tmp/kinetoscope/traces: whoever creates /tmp/kinetoscope first must not
    decide where a root daemon writes."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    squatted = tmp / "kinetoscope"
    squatted.mkdir()
    os.chown(squatted, 65534, 65534)
    with pytest.raises(KinetoscopeError, match="owned by uid 65534"):
        make_daemon(trace_root=str(squatted / "traces"))
    link = tmp / "link"
    os.symlink(tmp_path, link)
    os.lchown(link, 65534, 65534)  # a symlink another user planted on the way
    with pytest.raises(PathRefused, match="owned by uid 65534"):
        check_root_chain(str(link / "traces"))
    assert not (squatted / "traces").exists()


# ------------------------------------------------------------------ a second daemon
@pytest.mark.timeout(60)
def test_a_second_daemon_on_the_same_socket_dir_is_refused_and_the_first_keeps_its_socket(
    make_daemon, sockdir, tmp_path
):
    first = make_daemon()
    with pytest.raises(KinetoscopeError, match=rf"in use by another kscope daemon \(pid {os.getpid()}"):
        make_daemon(trace_root=str(tmp_path / "other"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "kinetoscope.cli.main", "daemon", "--port", "0", "--metrics-port", "-1",
         "--ipc-socket-dir", sockdir, "--trace-root", str(tmp_path / "cli"), "--no-gpu-metrics"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert f"pid {os.getpid()}" in proc.stderr and "Traceback" not in proc.stderr
    c = IpcClient(first.ipc.endpoint.address, sockdir)
    try:
        assert c.poll([4243, 1]) == ""  # the first daemon still answers on its socket
    finally:
        c.close()
    assert len(first.registry) == 1


@pytest.mark.timeout(60)
def test_a_socket_someone_receives_on_is_left_alone(make_daemon, sockdir):
    """A dynolog (no lock file) already bound there: refused, its socket untouched."""
    path = os.path.join(sockdir, "dynolog")
    other = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    other.bind(path)
    try:
        with pytest.raises(KinetoscopeError, match="is in use"):
            make_daemon()
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sender.sendto(b"still mine", path)
        sender.close()
        other.settimeout(5)
        assert other.recv(64) == b"still mine"
    finally:
        other.close()


# ------------------------------------------------------------------ registrations and listings
def test_one_user_cannot_fill_the_registry():
    reg = Registry(info_reader=lambda pid, sender: None, max_per_uid=3)
    for pid in range(10, 16):
        reg.poll(1, (pid, 1), 3, sender_uid=1000)
    assert len(reg) == 3 and reg.refused == 3
    reg.poll(1, (99, 1), 3, sender_uid=1001)  # another user still registers
    assert len(reg) == 4
    reg.poll(1, (10, 1), 3, sender_uid=1000)  # the registered ones keep being served
    assert [p.pid for p, _ in reg.snapshot()] == [10, 11, 12, 99]


@pytest.mark.timeout(120)
def test_ipc_registrations_per_user_and_pids_per_process_are_bounded(make_daemon, sockdir):
    d = make_daemon(max_processes_per_uid=5)
    c = IpcClient(d.ipc.endpoint.address, sockdir)
    try:
        for pid in range(1000, 1012):
            assert c.poll([pid, 1]) == ""  # answered, registered or not
        assert len(d.registry) == 5
        assert c.poll(list(range(2000, 2017)), timeout=0.5) is None  # 17 pids: Kineto sends 11 at most
        assert d.ipc.stats.dropped.get("too_many_pids") == 1
    finally:
        c.close()


@pytest.mark.timeout(120)
def test_process_listings_are_paged(make_daemon):
    from kinetoscope.collect.client import DaemonClient

    d = make_daemon(max_processes_per_uid=5000)
    for pid in range(1, 2501):
        d.registry.poll(9, (pid + 10_000,), 3)
    first = rpc(d.rpc_port, {"fn": "kscopeListProcesses"})
    assert len(first["processes"]) == 1000 and first["total"] == 2500 and first["next_offset"] == 1000
    last = rpc(d.rpc_port, {"fn": "kscopeListProcesses", "offset": 2000, "limit": 5000})
    assert len(last["processes"]) == 500 and last["next_offset"] is None
    whole = DaemonClient(f"127.0.0.1:{d.rpc_port}").list_processes()
    assert len({p.pid for p in whole.processes}) == 2500
    res = rpc(d.rpc_port, {"fn": "kscopeTrace", "trace_id": "none", "job_id": 404})
    assert len(res["registered"]) < 2000  # the "nothing matched" summary is bounded too


# ------------------------------------------------------------------ field validation
@pytest.mark.parametrize("fn", ["kscopeListProcesses", "kscopeTrace"])
def test_a_huge_job_id_is_one_clear_error_without_a_traceback(daemon, caplog, fn):
    with caplog.at_level(logging.INFO, logger="kinetoscope"):
        for _ in range(3):
            res = rpc(daemon.rpc_port, {"fn": fn, "trace_id": "j", "job_id": "1" * 5000})
            assert res["status"] == "failed" and "job_id" in res["error"], res
            assert "internal error" not in res["error"]
    assert not [r for r in caplog.records if r.exc_info]


def test_trace_ids_with_a_trailing_newline_are_refused(daemon):
    from kinetoscope.collect.trigger import validate_trace_id
    from kinetoscope.errors import UsageError

    assert not valid_trace_id("abc\n") and valid_trace_id("abc")
    assert not TRACE_ID_RE.match("abc\n")
    with pytest.raises(UsageError):
        validate_trace_id("abc\n")
    res = rpc(daemon.rpc_port, {"fn": "kscopeTrace", "trace_id": "abc\n", "all": True})
    assert res["status"] == "failed" and "trace_id" in res["error"]


def test_a_negative_profile_start_time_is_refused(daemon, trace_root):
    config = (
        f"ACTIVITIES_LOG_FILE={trace_root}/n/t.json\nPROFILE_START_TIME=-5\nACTIVITIES_DURATION_MSECS=100"
    )
    res = rpc(daemon.rpc_port, {"fn": "setKinetOnDemandRequest", "config": config, "pids": [], "job_id": 0})
    assert res["status"] == "failed" and "negative" in res["error"], res


# ------------------------------------------------------------------ failed token attempts
def test_failed_token_attempts_are_slowed_per_address():
    now = [0.0]
    t = AuthThrottle(clock=lambda: now[0])
    delays = [t.failed(("10.0.0.1", 5000 + i)) for i in range(8)]
    assert delays[0] == STEP_S and delays == sorted(delays) and delays[-1] == MAX_DELAY_S
    assert t.failed(("10.0.0.2", 1)) == STEP_S  # another address starts low
    now[0] += 3600  # forgotten after a quiet while
    assert t.failed(("10.0.0.1", 1)) == STEP_S


@pytest.mark.timeout(120)
def test_failed_token_attempts_are_logged_rate_limited_and_answered(make_daemon, caplog):
    d = make_daemon(token="s3cret")
    with caplog.at_level(logging.WARNING, logger="kinetoscope.daemon"):
        for fn in ["getStatus", "kscopeListProcesses"] * 3:
            res = rpc(d.rpc_port, {"fn": fn, "token": "guess"})
            assert "unauthorized" in res["error"]
        assert rpc(d.rpc_port, {"fn": "kscopeListProcesses", "token": "s3cret"})["status"] == "ok"
    lines = [r for r in caplog.records if "wrong token" in r.getMessage()]
    assert 1 <= len(lines) <= 5 and "127.0.0.1" in lines[0].getMessage()
    assert d.handlers.auth_throttle.total == 6


@pytest.mark.timeout(120)
def test_held_back_answers_are_bounded_at_the_door(monkeypatch):
    """Past MAX_DEFERRED held-back answers, new requests are refused as busy *before* they are
    evaluated; the held-back ones are neither dropped nor answered early (that would tell a
    guesser "wrong token" at once)."""
    from kinetoscope.daemon import rpc_server
    from kinetoscope.protocol import wire

    monkeypatch.setattr(rpc_server, "MAX_DEFERRED", 2)
    server = rpc_server.RpcServer(
        [rpc_server.BindSpec("127.0.0.1")], 0, lambda body: b'{"status":"failed","error":"unauthorized"}',
        lambda msg: orjson.dumps({"status": "failed", "error": msg}), penalty=lambda peer: 60.0,
    )  # fmt: skip
    server.start()
    conns = []
    try:
        for _ in range(2):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            s.sendall(wire.frame_rpc(b'{"fn":"getStatus"}'))
            conns.append(s)
        while len(server._deferred) < 2:  # both reached the loop and wait there
            rpc_server.time.sleep(0.01)
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as third:
            third.sendall(wire.frame_rpc(b'{"fn":"getStatus"}'))
            assert b"server busy" in wire.read_rpc_frame(third)
        for s in conns:
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(1)  # still held back: not answered, not closed
    finally:
        for s in conns:
            s.close()
        server.stop()
