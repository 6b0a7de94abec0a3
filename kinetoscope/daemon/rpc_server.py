"""The TCP side ``dyno`` talks to: native int32 length + JSON, one request per connection.

Why not Dynolog's design (docs/protocol.md §3.1): its single thread reads with no timeout, so one client
that connects and says nothing blocks every ``dyno`` call forever. Why not a thread per
connection either: slow clients then hold the threads (issue 16: 64 connections trickling one
byte every 1.5 s kept every slot, and every ``getStatus`` got "server busy").

Here one selector thread accepts and *reads* every connection without blocking, so a slow
client costs a buffer, not a worker. Each request has a total deadline (``timeout_s``, from
accept to the last byte) and a minimum rate (after a grace second, ``min_rate_bps`` bytes per
second on average); at most ``max_pending`` connections are being read at once (the oldest is
dropped for a new one). A complete request is answered on the loop itself when it is cheap
(``fast``: ``getStatus``, ``getVersion``, errors), else by one of at most ``max_connections``
worker threads. So status stays answerable under any flood of slow connections. Every
request - even an unreadable one - gets a JSON answer before the close.

With TLS (``tls``, an ``ssl.SSLContext``: daemon/tls.py) every accepted connection is first
peeked at: a first byte other than a TLS handshake record is a plain-text client, answered in
plain text that TLS is required; otherwise the connection is wrapped and its handshake driven
by the same loop without blocking (it counts against the same deadline).

Listening addresses: loopback by default (127.0.0.1 and ::1, because ``dyno --hostname
localhost`` connects to the *first* address ``localhost`` resolves to, which may be ::1);
``::`` means dual-stack on every interface like Dynolog.
"""

from __future__ import annotations

import errno
import heapq
import ipaddress
import logging
import resource
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kinetoscope.daemon.logsetup import RateLimitedLogger
from kinetoscope.daemon.loop_thread import LoopThread
from kinetoscope.daemon.tls import PLAIN_CLIENT_ERROR, TLS_HANDSHAKE_RECORD
from kinetoscope.errors import KinetoscopeError
from kinetoscope.protocol import wire

log = logging.getLogger("kinetoscope.daemon.rpc")

DEFAULT_BINDS = ("127.0.0.1", "::1")
DEFAULT_MIN_RATE_BPS = 1024  # a request must average this after the grace period
RATE_GRACE_S = 1.0
DRAIN_S = 0.5  # after an error reply, read (and discard) what the client still sends
MAX_BUFFERED_BYTES = 64 << 20  # all partly received requests together
MAX_DEFERRED = 256  # answers held back (failed token attempts); beyond, new requests are "busy"
_SWEEP_S = 0.2
_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)

# TLS states of a connection being read (None: plain text, no TLS configured)
TLS_PEEK = "peek"  # nothing read yet: is it a TLS client at all?
TLS_HANDSHAKE = "handshake"
TLS_READY = "ready"


def default_max_pending() -> int:
    """Connections read at once: 1024, or half the open-file limit if that is lower."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(16, min(1024, soft // 2))


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


def is_loopback(host: str) -> bool:
    """Whether ``--bind host`` listens on loopback only (a name is resolved like the bind does)."""
    _family, addr = _family_and_addr(host)
    try:
        return ipaddress.ip_address(addr.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


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


@dataclass(eq=False)
class _Pending:
    """A connection whose request is being read (or, after an error reply, drained)."""

    conn: socket.socket
    peer: object
    started: float
    deadline: float
    frame: wire.FrameAssembler = field(default_factory=wire.FrameAssembler)
    draining_until: float | None = None
    tls_state: str | None = None


class RpcServer:
    """Accepts connections and serves one framed request on each. See the module docstring."""

    def __init__(
        self,
        binds: list[BindSpec],
        port: int,
        handle: Callable[[bytes], bytes],
        frame_error: Callable[[str], bytes],
        timeout_s: float = 5.0,
        max_connections: int = 64,
        *,
        fast: Callable[[bytes], bool] = lambda body: False,
        max_pending: int | None = None,
        min_rate_bps: float = DEFAULT_MIN_RATE_BPS,
        penalty: Callable[[object], float] = lambda peer: 0.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.binds = binds
        self.tls = tls
        self.tls_failures = 0  # handshakes that failed (no/bad client certificate, plain text, ...)
        self.port = port
        self._handle = handle
        self._frame_error = frame_error
        self._fast = fast
        # seconds to hold back the answer just computed (on this thread) for ``peer``: failed
        # token attempts are slowed without a worker or the loop waiting (see _defer)
        self._penalty = penalty
        self._deferred: list[tuple[float, int, socket.socket, bytes]] = []  # heap by due time
        self._handoff: list[tuple[float, socket.socket, bytes]] = []  # from workers, under _handoff_lock
        self._handoff_lock = threading.Lock()
        self._seq = 0
        self.timeout_s = timeout_s
        self.min_rate_bps = min_rate_bps
        self.max_pending = max_pending or default_max_pending()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._listeners: list[socket.socket] = []
        self.addresses: list[tuple[str, int]] = []
        self._loop_thread = LoopThread("kscope-rpc")
        self._rl = RateLimitedLogger(log)
        self._pending: dict[socket.socket, _Pending] = {}
        self._buffered = 0
        self._sel: selectors.BaseSelector | None = None

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
                hint = (
                    " (is another kscope daemon or dynolog running? use --port)"
                    if exc.errno == errno.EADDRINUSE
                    else ""
                )
                raise KinetoscopeError(
                    f"cannot listen on {spec.host} port {port}: {exc.strerror}{hint}"
                ) from exc
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

    @property
    def pending_count(self) -> int:
        """Connections whose request is still being read (for tests and metrics)."""
        return len(self._pending)

    # ------------------------------------------------------------------ the loop
    def _accept_loop(self) -> None:
        sel = self._sel = selectors.DefaultSelector()
        for s in self._listeners:
            sel.register(s, selectors.EVENT_READ)
        sel.register(self._loop_thread.wake, selectors.EVENT_READ)
        last_sweep = time.monotonic()
        try:
            while not self._loop_thread.stopping.is_set():
                for key, _ in sel.select(self._select_timeout()):
                    if key.fileobj is self._loop_thread.wake:
                        self._loop_thread.drain_wake()
                        continue
                    if key.data is None:
                        self._accept(key.fileobj)  # type: ignore[arg-type]
                    else:
                        self._guarded(key.data)
                now = time.monotonic()
                self._send_deferred(now)
                if now - last_sweep >= _SWEEP_S:
                    self._sweep(now)
                    last_sweep = now
        finally:
            for p in list(self._pending.values()):
                self._forget(p)
                p.conn.close()
            self._send_deferred(float("inf"))
            sel.close()

    # ------------------------------------------------------------------ held-back answers
    def _select_timeout(self) -> float | None:
        timeout = _SWEEP_S if self._pending else None
        if self._handoff:
            return 0.0
        if self._deferred:
            due = max(0.0, self._deferred[0][0] - time.monotonic())
            timeout = due if timeout is None else min(timeout, due)
        return timeout

    def _defer(self, conn: socket.socket, answer: bytes, delay_s: float) -> None:
        """Answer ``conn`` ``delay_s`` from now, on the loop (no thread waits meanwhile).

        Never answered early nor dropped: an early close would tell a guesser "wrong token" at
        once. The bound is kept at the door instead (:meth:`_dispatch`)."""
        self._seq += 1
        heapq.heappush(self._deferred, (time.monotonic() + delay_s, self._seq, conn, answer))

    def _send_deferred(self, now: float) -> None:
        if self._handoff:
            with self._handoff_lock:
                handed, self._handoff = self._handoff, []
            for due, conn, answer in handed:
                self._defer(conn, answer, max(0.0, due - time.monotonic()))
        while self._deferred and self._deferred[0][0] <= now:
            _due, _seq, conn, answer = heapq.heappop(self._deferred)
            self._send_small(conn, answer)
            conn.close()

    def _guarded(self, p: _Pending) -> None:
        """Serve one readable connection; a bug costs that connection, never the loop."""
        try:
            self._on_readable(p)
        except Exception:
            self._rl.exception("loop", "error while serving RPC connection from %s", p.peer)
            try:
                self._send_small(p.conn, self._frame_error("internal error while reading the request"))
            finally:
                self._close(p)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE etc.: do not spin; the next wake-up retries
                self._rl.warning("accept", "accept failed: %s", exc)
                return
            conn.setblocking(False)
            if len(self._pending) >= self.max_pending:
                oldest = next(iter(self._pending.values()))  # dicts keep insertion (= accept) order
                self._rl.warning(
                    "pending",
                    "%d RPC connections being read; dropping the oldest, %s",
                    len(self._pending),
                    oldest.peer,
                )
                if oldest.draining_until is None:  # not answered yet; no drain, to stay within the bound
                    self._send_small(
                        oldest.conn, self._frame_error("server busy: too many connections sending requests")
                    )
                self._close(oldest)
            now = time.monotonic()
            p = _Pending(conn, peer, now, now + self.timeout_s, tls_state=TLS_PEEK if self.tls else None)
            self._pending[conn] = p
            assert self._sel is not None
            self._sel.register(conn, selectors.EVENT_READ, p)
            self._guarded(p)  # the request is often there already

    def _on_readable(self, p: _Pending) -> None:
        if p.draining_until is not None:
            self._drain(p)
            return
        if p.tls_state == TLS_PEEK and not self._tls_start(p):
            return
        if p.tls_state == TLS_HANDSHAKE and not self._tls_handshake(p):
            return
        while self._read_some(p):
            # TLS decrypts whole records: what is left in the SSL buffer never wakes the selector
            if not (isinstance(p.conn, ssl.SSLSocket) and p.conn.pending()):
                return

    def _read_some(self, p: _Pending) -> bool:
        """One recv into the frame; True when the connection is still being read."""
        try:
            data = p.conn.recv(min(p.frame.wanted, 65536))
        except _WOULD_BLOCK:
            return False
        except OSError as exc:
            self._rl.debug("conn", "RPC connection from %s failed: %s", p.peer, exc)
            self._close(p)
            return False
        if not data:
            expected = "?" if p.frame.length is None else str(p.frame.length + wire.RPC_LENGTH.size)
            self._frame_failed(p, f"connection closed after {p.frame.received} of {expected} bytes")
            return False
        self._buffered += len(data)
        try:
            p.frame.feed(data)
        except wire.FrameError as exc:
            self._frame_failed(p, str(exc))
            return False
        if self._buffered > MAX_BUFFERED_BYTES:
            self._rl.warning(
                "memory", "RPC requests being read hold %d bytes; refusing %s", self._buffered, p.peer
            )
            self._fail(p, "server busy: too much request data in flight")
            return False
        if p.frame.done:
            self._dispatch(p)
            return False
        return True

    # ------------------------------------------------------------------ TLS
    def _tls_start(self, p: _Pending) -> bool:
        """Peek at the first byte: answer a plain-text client, wrap a TLS one. True = go on."""
        try:
            first = p.conn.recv(1, socket.MSG_PEEK)
        except _WOULD_BLOCK:
            return False
        except OSError:
            self._close(p)
            return False
        if not first:
            self._close(p)
            return False
        if first[0] != TLS_HANDSHAKE_RECORD:
            self.tls_failures += 1
            self._rl.warning("tls", "plain-text RPC client %s on a TLS daemon; refused", p.peer)
            p.tls_state = None
            self._fail(p, PLAIN_CLIENT_ERROR)
            return False
        assert self.tls is not None and self._sel is not None
        self._forget(p)
        try:
            p.conn = self.tls.wrap_socket(p.conn, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError) as exc:
            self._rl.warning("tls", "cannot start TLS with %s: %s", p.peer, exc)
            p.conn.close()
            return False
        p.tls_state = TLS_HANDSHAKE
        self._pending[p.conn] = p
        self._sel.register(p.conn, selectors.EVENT_READ, p)
        return True

    def _tls_handshake(self, p: _Pending) -> bool:
        """Advance the handshake; True once done. A failed one is logged and closed (the
        client's TLS library reports the alert: no certificate, unknown CA, ...)."""
        conn = p.conn
        assert isinstance(conn, ssl.SSLSocket)
        try:
            conn.do_handshake()
        except _WOULD_BLOCK:
            return False
        except (ssl.SSLError, OSError) as exc:
            self.tls_failures += 1
            reason = getattr(exc, "reason", None) or exc
            self._rl.warning("tls", "TLS handshake with RPC client %s failed: %s", p.peer, reason)
            self._linger(p)
            return False
        p.tls_state = TLS_READY
        return True

    def _sweep(self, now: float) -> None:
        """Answer and drop every connection past its deadline or below the minimum rate."""
        for p in list(self._pending.values()):
            if p.draining_until is not None:
                if now >= p.draining_until:
                    self._close(p)
                continue
            elapsed = now - p.started
            if now >= p.deadline:
                self._rl.warning(
                    "timeout", "RPC client %s sent no complete request in %.1f s", p.peer, self.timeout_s
                )
                self._fail(
                    p,
                    f"timed out after {self.timeout_s:g} s waiting for the request (--rpc-timeout is per request)",
                )
            elif elapsed > RATE_GRACE_S and p.frame.received < self.min_rate_bps * (elapsed - RATE_GRACE_S):
                self._rl.warning(
                    "slow", "RPC client %s too slow: %d bytes in %.1f s", p.peer, p.frame.received, elapsed
                )
                self._fail(
                    p,
                    f"timed out: {p.frame.received} request bytes in {elapsed:.1f} s, below the minimum of "
                    f"{self.min_rate_bps:g} bytes/s",
                )

    # ------------------------------------------------------------------ answers
    def _dispatch(self, p: _Pending) -> None:
        """A whole request: answer it here if cheap, else on a worker thread (or say busy)."""
        self._forget(p)
        body = p.frame.body
        if len(self._deferred) + len(self._handoff) >= MAX_DEFERRED:
            # a flood of failed token attempts is being answered: refuse before evaluating
            # anything (so the refusal says nothing about the token)
            self._rl.warning("deferred", "%d answers held back; refusing %s", len(self._deferred), p.peer)
            self._send_small(p.conn, self._frame_error("server busy: too many failed token attempts"))
            p.conn.close()
            return
        if self._fast(body):
            answer = self._handle(body)
            delay = self._penalty(p.peer)
            if delay > 0:
                self._defer(p.conn, answer, delay)
                return
            self._send_small(p.conn, answer)
            p.conn.close()
            return
        if not self._slots.acquire(blocking=False):
            self._rl.warning("busy", "too many concurrent RPC requests; refusing %s", p.peer)
            self._send_small(p.conn, self._frame_error("server busy: too many concurrent requests"))
            p.conn.close()
            return
        t = threading.Thread(
            target=self._serve, args=(p.conn, body, p.peer), name="kscope-rpc-conn", daemon=True
        )
        t.start()

    def _serve(self, conn: socket.socket, body: bytes, peer: object = None) -> None:
        handed_off = False
        try:
            answer = self._handle(body)
            delay = self._penalty(peer)
            if delay > 0:  # the loop sends it later; this worker is free now
                with self._handoff_lock:
                    self._handoff.append((time.monotonic() + delay, conn, answer))
                handed_off = True
                self._loop_thread.poke()
                return
            response = wire.frame_rpc(answer)
            conn.setblocking(True)
            conn.settimeout(self.timeout_s)
            conn.sendall(response)
        except OSError:
            pass
        finally:
            if not handed_off:
                conn.close()
            self._slots.release()

    def _frame_failed(self, p: _Pending, message: str) -> None:
        self._rl.warning("frame", "bad RPC frame from %s: %s", p.peer, message)
        self._fail(p, f"bad request frame: {message}")

    def _fail(self, p: _Pending, message: str) -> None:
        """Answer with an error, then drain what the client still sends for a moment, so the
        close does not reset the connection before the client reads the answer."""
        self._send_small(p.conn, self._frame_error(message))
        try:
            p.conn.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(p)
            return
        self._buffered -= p.frame.received
        p.frame = wire.FrameAssembler()
        p.draining_until = time.monotonic() + DRAIN_S
        self._drain(p)

    def _linger(self, p: _Pending) -> None:
        """Close after a failed handshake without a reset: the client must be able to read the
        TLS alert (it says why: no certificate, unknown CA), which a close with its unread
        request still queued here would destroy. So: half-close, then drain like ``_fail``."""
        try:
            p.conn.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(p)
            return
        self._buffered -= p.frame.received
        p.frame = wire.FrameAssembler()
        p.draining_until = time.monotonic() + DRAIN_S
        self._drain(p)

    def _drain(self, p: _Pending) -> None:
        for _ in range(16):
            try:
                if not p.conn.recv(65536):
                    break
            except _WOULD_BLOCK:
                return
            except OSError:
                break
        self._close(p)

    @staticmethod
    def _send_small(conn: socket.socket, body: bytes) -> None:
        """Send a short answer without blocking the loop: it fits any fresh socket's buffer;
        a client that does not read even that loses it."""
        try:
            conn.send(wire.frame_rpc(body))
        except OSError:
            pass

    def _forget(self, p: _Pending) -> None:
        if self._pending.pop(p.conn, None) is not None:
            self._buffered -= p.frame.received
            if self._sel is not None:
                try:
                    self._sel.unregister(p.conn)
                except (KeyError, ValueError):
                    pass

    def _close(self, p: _Pending) -> None:
        self._forget(p)
        p.conn.close()
