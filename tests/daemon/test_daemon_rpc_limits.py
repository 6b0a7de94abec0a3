"""Issue 16 item 2: the RPC deadline is per request (total, plus a minimum rate), and a flood
of slow connections cannot make ``getStatus`` answer "server busy". Real daemon, real sockets;
no timing assertions beyond "answered" (generous client timeouts)."""

from __future__ import annotations

import socket
import struct
import threading
import time

import orjson
import pytest
from daemon_helpers import rpc

from kinetoscope.daemon.rpc_server import BindSpec, RpcServer
from kinetoscope.protocol import wire


class SlowLoris:
    """``n`` connections that each claim a 100 KB request and send one byte every ``period_s``,
    reconnecting whenever the server drops them (an attacker keeps the pressure on)."""

    def __init__(self, port: int, n: int, period_s: float = 0.5) -> None:
        self.port, self.n, self.period_s = port, n, period_s
        self.socks: list[socket.socket] = []
        self.reconnects = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        s.sendall(struct.pack("=i", 100_000))
        s.setblocking(False)
        return s

    def start(self) -> SlowLoris:
        self.socks = [self._connect() for _ in range(self.n)]
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            for i, s in enumerate(self.socks):
                try:
                    s.send(b" ")
                    if s.recv(4096, socket.MSG_PEEK) is not None:  # answered or closed: dropped
                        raise ConnectionError
                except BlockingIOError:
                    continue
                except OSError:
                    s.close()
                    try:
                        self.socks[i] = self._connect()
                        self.reconnects += 1
                    except OSError:
                        pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for s in self.socks:
            s.close()


def test_status_stays_answerable_under_a_slow_loris_flood(make_daemon):
    d = make_daemon(rpc_timeout_s=30.0)  # per-recv on the old server: the flood is never dropped
    flood = SlowLoris(d.rpc_port, n=100).start()  # more than the 64 request slots
    try:
        time.sleep(0.3)
        for _ in range(10):
            assert rpc(d.rpc_port, {"fn": "getStatus"}) == {"status": 1}
            time.sleep(0.2)
        assert rpc(d.rpc_port, {"fn": "getVersion"})["version"]
        assert rpc(d.rpc_port, {"fn": "kscopeListProcesses"})["status"] == "ok"  # a worker is free too
    finally:
        flood.stop()


def _trickle(port: int, claimed: int, period_s: float) -> tuple[dict, int]:
    """Claim ``claimed`` body bytes, send one every ``period_s`` until the server answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(struct.pack("=i", claimed))
        sent = 0
        s.setblocking(False)
        while sent < claimed:
            try:
                if s.recv(1, socket.MSG_PEEK):
                    break
            except BlockingIOError:
                pass
            try:
                s.send(b" ")
            except OSError:
                break
            sent += 1
            time.sleep(period_s)
        s.setblocking(True)
        return orjson.loads(wire.read_rpc_frame(s)), sent


def test_a_request_trickling_below_the_minimum_rate_is_cut_off(make_daemon):
    d = make_daemon(rpc_timeout_s=60.0)
    reply, sent = _trickle(d.rpc_port, claimed=400, period_s=0.05)  # ~20 B/s < 1024 B/s
    assert reply["status"] == "failed" and "timed out" in reply["error"] and "bytes/s" in reply["error"]
    assert sent < 400  # answered before the client finished
    assert rpc(d.rpc_port, {"fn": "getStatus"}) == {"status": 1}


def test_the_rpc_timeout_bounds_the_whole_request(make_daemon):
    d = make_daemon(rpc_timeout_s=1.5, rpc_min_rate_bps=1.0)  # the rate alone would allow it
    reply, sent = _trickle(d.rpc_port, claimed=300, period_s=0.05)
    assert reply["status"] == "failed" and "timed out after 1.5 s" in reply["error"]
    assert sent < 300


def test_oldest_connection_is_dropped_when_too_many_are_being_read():
    server = RpcServer(
        [BindSpec("127.0.0.1")], 0, handle=lambda body: b'{"status":1}',
        frame_error=lambda msg: orjson.dumps({"status": "failed", "error": msg}),
        timeout_s=30.0, max_pending=4, min_rate_bps=0.0,
    )  # fmt: skip
    server.start()
    silent = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(4)]
    try:
        deadline = time.monotonic() + 10
        while server.pending_count < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rpc(server.port, {"fn": "getStatus"}) == {"status": 1}
        reply = orjson.loads(wire.read_rpc_frame(silent[0]))  # the oldest made room
        assert reply["status"] == "failed" and "busy" in reply["error"]
    finally:
        for s in silent:
            s.close()
        server.stop()


@pytest.mark.parametrize("n", [1, 3])
def test_partial_requests_then_complete_ones_are_served(daemon, n):
    """Requests split across many small sends (legitimately slow but fast enough) still work."""
    body = orjson.dumps({"fn": "getStatus"})
    frame = wire.frame_rpc(body)
    with socket.create_connection(("127.0.0.1", daemon.rpc_port), timeout=10) as s:
        for i in range(0, len(frame), n):
            s.sendall(frame[i : i + n])
        assert wire.read_rpc_frame(s) == b'{"status":1}'


@pytest.mark.parametrize("fn", [{"a": 1}, [1, 2], None, 3.5])
def test_unhashable_or_odd_fn_is_answered_and_the_loop_survives(daemon, fn):
    """Found by tests/fuzz: ``{"fn": {...}}`` crashed the fast-path check and with it the RPC loop."""
    reply = rpc(daemon.rpc_port, {"fn": fn})
    assert reply["status"] == "failed" and "fn" in reply["error"]
    assert rpc(daemon.rpc_port, {"fn": "getStatus"}) == {"status": 1}
