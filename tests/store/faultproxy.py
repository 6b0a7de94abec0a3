"""A tiny real TCP proxy that injects faults into HTTP/1.1 traffic (for S3 retry tests).

It sits between s3fs and moto's server on loopback. Requests from the client are parsed one by
one (request line, headers, body by Content-Length or chunked); a policy picks an action per
request:

* ``"forward"``: pass it on;
* ``"reset"``: drop the connection abruptly (RST) without answering;
* ``"503"``: answer ``503 SlowDown`` (S3's throttling error) and close;
* ``("cut", n)``: forward the head and the first ``n`` body bytes, then drop both connections
  (an upload interrupted in flight).

Responses are pumped back unparsed. Nothing here mocks the client: s3fs/aiobotocore/aiohttp
see real sockets and real bytes.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Action = Any  # "forward" | "reset" | "503" | ("cut", int)

SLOWDOWN_XML = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>kscope-test</RequestId></Error>"
)


@dataclass
class Request:
    method: str
    target: str
    action: Action


@dataclass
class FaultProxy:
    upstream: tuple[str, int]
    policy: Callable[[int, str, str], Action] = field(default=lambda i, m, t: "forward")
    log: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept_loop, name="faultproxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def faults(self) -> list[Request]:
        return [r for r in self.log if r.action != "forward"]

    def close(self) -> None:
        self._stop.set()
        try:  # wake the blocked accept() (closing alone does not on Linux)
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            pass
        _close(self._sock)
        with self._lock:
            for c in list(self._conns):
                _close(c)
        self._thread.join(timeout=5)

    # -- internals -----------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            if self._stop.is_set():
                _close(client)
                return
            with self._lock:
                self._conns.add(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _decide(self, method: str, target: str) -> Action:
        with self._lock:
            n = len(self.log)
            action = self.policy(n, method, target)
            self.log.append(Request(method, target, action))
        return action

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = client.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                method, target = lines[0].split(" ")[:2]
                headers = {}
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    headers[k.strip().lower()] = v.strip()
                action = self._decide(method, target)
                if action == "reset":
                    _rst(client)
                    return
                expect = headers.get("expect", "").lower() == "100-continue"
                if action == "503":
                    if not expect:
                        buf = self._drain_body(client, headers, buf)
                    body = b"" if method == "HEAD" else SLOWDOWN_XML
                    client.sendall(
                        b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                        + f"Content-Length: {len(SLOWDOWN_XML)}\r\n".encode()
                        + b"Connection: close\r\n\r\n"
                        + body
                    )
                    _close(client)
                    return
                if upstream is None:
                    upstream = socket.create_connection(self.upstream)
                    with self._lock:
                        self._conns.add(upstream)
                    threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
                upstream.sendall(head + b"\r\n\r\n")
                limit = action[1] if isinstance(action, tuple) and action[0] == "cut" else None
                buf, cut = self._forward_body(client, upstream, headers, buf, limit)
                if cut:
                    _rst(client)
                    _rst(upstream)
                    return
        except OSError:
            return
        finally:
            _close(client)
            if upstream is not None:
                _close(upstream)

    def _read_more(self, client: socket.socket) -> bytes:
        data = client.recv(65536)
        if not data:
            raise OSError("client closed mid-request")
        return data

    def _drain_body(self, client: socket.socket, headers: dict[str, str], buf: bytes) -> bytes:
        n = int(headers.get("content-length", "0") or 0)
        while len(buf) < n:
            buf += self._read_more(client)
        return buf[n:]

    def _forward_body(
        self,
        client: socket.socket,
        upstream: socket.socket,
        headers: dict[str, str],
        buf: bytes,
        limit: int | None,
    ) -> tuple[bytes, bool]:
        sent = 0

        def send(chunk: bytes) -> bool:
            nonlocal sent
            if limit is not None and sent + len(chunk) > limit:
                upstream.sendall(chunk[: max(limit - sent, 0)])
                return True
            upstream.sendall(chunk)
            sent += len(chunk)
            return False

        if "chunked" in headers.get("transfer-encoding", "").lower():
            # Not parsed: forward the rest of this connection raw (no more per-request faults).
            if buf:
                upstream.sendall(buf)
            _pump(client, upstream)
            return b"", True
        n = int(headers.get("content-length", "0") or 0)
        remaining = n
        while remaining > 0:
            if not buf:
                buf = self._read_more(client)
            chunk, buf = buf[:remaining], buf[remaining:]
            remaining -= len(chunk)
            if send(chunk):
                return b"", True
        return buf, False


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        _close(dst)
        _close(src)


def _rst(s: socket.socket) -> None:
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    _close(s)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
