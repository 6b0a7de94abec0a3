"""The TCP side ``dyno`` talks to: native int32 length + JSON, one request per connection.

Why not Dynolog's design (spec §3.1): its single thread reads with no timeout, so one client
that connects and says nothing blocks every ``dyno`` call forever. Here an acceptor thread
hands each connection to its own short-lived thread (bounded), every connection has a
deadline, and every request - even an unreadable one - gets a JSON answer before the close.

Listening addresses: loopback by default (127.0.0.1 and ::1, because ``dyno --hostname
localhost`` connects to the *first* address ``localhost`` resolves to, which may be ::1);
``::`` means dual-stack on every interface like Dynolog.
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kinetoscope.daemon import wire
from kinetoscope.daemon.logsetup import RateLimitedLogger
from kinetoscope.daemon.loop_thread import LoopThread
from kinetoscope.errors import KinetoscopeError

log = logging.getLogger("kinetoscope.daemon.rpc")

DEFAULT_BINDS = ("127.0.0.1", "::1")


@dataclass(frozen=True)
class BindSpec:
    host: str
    optional: bool = False  # skip silently if the address does not exist (::1 without IPv6)


def _family_and_addr(host: str) -> tuple[socket.AddressFamily, str]:
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host.strip("[]"))
            return family, host.strip("[]")
        except OSError:
            continue
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise KinetoscopeError(f"cannot resolve --bind {host!r}: {exc}") from exc
    family, _t, _p, _c, sockaddr = infos[0]
    return family, str(sockaddr[0])


def bind_listener(host: str, port: int) -> socket.socket:
    family, addr = _family_and_addr(host)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            # "::" = dual-stack like Dynolog; any other v6 address: v6 only.
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if addr == "::" else 1)
        sock.bind((addr, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class RpcServer:
    """Accepts connections and serves one framed request on each, concurrently."""

    def __init__(
        self,
        binds: list[BindSpec],
        port: int,
        handle: Callable[[bytes], bytes],
        frame_error: Callable[[str], bytes],
        timeout_s: float = 5.0,
        max_connections: int = 64,
    ) -> None:
        self.binds = binds
        self.port = port
        self._handle = handle
        self._frame_error = frame_error
        self.timeout_s = timeout_s
        self._slots = threading.BoundedSemaphore(max_connections)
        self._listeners: list[socket.socket] = []
        self.addresses: list[tuple[str, int]] = []
        self._loop_thread = LoopThread("kscope-rpc")
        self._rl = RateLimitedLogger(log)

    def start(self) -> None:
        port = self.port
        for spec in self.binds:
            try:
                sock = bind_listener(spec.host, port)
            except OSError as exc:
                if spec.optional and exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                    log.debug("not listening on %s: %s", spec.host, exc)
                    continue
                for s in self._listeners:
                    s.close()
                hint = " (is another kscope daemon or dynolog running? use --port)" if exc.errno == errno.EADDRINUSE else ""
                raise KinetoscopeError(f"cannot listen on {spec.host} port {port}: {exc.strerror}{hint}") from exc
            port = sock.getsockname()[1]  # the ephemeral port of the first, reused for the rest
            self._listeners.append(sock)
            self.addresses.append((sock.getsockname()[0], port))
        if not self._listeners:
            raise KinetoscopeError(f"no address to listen on among {[b.host for b in self.binds]}")
        self.port = port
        self._loop_thread.start(self._accept_loop)
        for host, p in self.addresses:
            log.info("RPC listening on %s port %d", host, p)

    def stop(self) -> None:
        self._loop_thread.stop()
        for s in self._listeners:
            s.close()
        self._listeners = []
        self._loop_thread.close()

    def _accept_loop(self) -> None:
        sel = selectors.DefaultSelector()
        for s in self._listeners:
            sel.register(s, selectors.EVENT_READ)
        sel.register(self._loop_thread.wake, selectors.EVENT_READ)
        try:
            while not self._loop_thread.stopping.is_set():
                for key, _ in sel.select():
                    if key.fileobj is self._loop_thread.wake:
                        continue
                    self._accept(key.fileobj)  # type: ignore[arg-type]
        finally:
            sel.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE etc.: do not spin; the next wake-up retries
                self._rl.warning("accept", "accept failed: %s", exc)
                return
            conn.setblocking(True)
            conn.settimeout(self.timeout_s)
            if not self._slots.acquire(blocking=False):
                self._rl.warning("busy", "too many concurrent RPC connections; refusing %s", peer)
                self._reply_and_close(conn, self._frame_error("server busy: too many concurrent connections"), drain=True)
                continue
            t = threading.Thread(target=self._serve, args=(conn, peer), name="kscope-rpc-conn", daemon=True)
            t.start()

    def _serve(self, conn: socket.socket, peer: object) -> None:
        try:
            try:
                body = wire.read_rpc_frame(conn)
            except wire.FrameError as exc:
                self._rl.warning("frame", "bad RPC frame from %s: %s", peer, exc)
                self._reply_and_close(conn, self._frame_error(f"bad request frame: {exc}"), drain=True)
                return
            except TimeoutError:
                self._rl.warning("timeout", "RPC client %s sent no complete request in %.1f s", peer, self.timeout_s)
                self._reply_and_close(conn, self._frame_error(f"timed out after {self.timeout_s:g} s waiting for the request"))
                return
            except OSError as exc:
                self._rl.debug("conn", "RPC connection from %s failed: %s", peer, exc)
                conn.close()
                return
            self._reply_and_close(conn, self._handle(body))
        finally:
            self._slots.release()

    def _reply_and_close(self, conn: socket.socket, body: bytes, drain: bool = False) -> None:
        """Send one framed response and close. ``drain`` reads (briefly) what the client may
        still be sending, so the close does not reset the connection before it reads us."""
        try:
            conn.sendall(wire.frame_rpc(body))
            if drain:
                conn.shutdown(socket.SHUT_WR)
                conn.settimeout(0.2)
                for _ in range(64):
                    if not conn.recv(65536):
                        break
        except OSError:
            pass
        finally:
            conn.close()
