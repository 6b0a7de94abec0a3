"""The daemon end of libkineto's IPC fabric: an AF_UNIX datagram socket named "dynolog".

Why it looks like this (docs/protocol.md §1): a polling process waits only ~90 ms for the reply and then
takes whatever arrives *next* as the answer to its *next* poll, so every "req" must be
answered at once and exactly once. Dynolog reads one datagram per 10 ms; this loop drains the
socket on every wake-up and replies with non-blocking ``sendto`` - a client whose socket is
gone or full costs one failed send, never a stall. Garbage is dropped, counted and logged with
rate limiting; nothing a client sends can stop the loop.

The sender's pid is taken from the kernel (``SO_PASSCRED``): it is translated into the
daemon's pid namespace, so /proc can be read for containerised clients too.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import selectors
import socket
import struct
import time
from dataclasses import dataclass

from kinetoscope.daemon.logsetup import RateLimitedLogger
from kinetoscope.daemon.loop_thread import LoopThread
from kinetoscope.daemon.metrics import DaemonMetrics
from kinetoscope.daemon.registry import MAX_PIDS_PER_PROCESS, Registry
from kinetoscope.errors import KinetoscopeError
from kinetoscope.protocol import wire

log = logging.getLogger("kinetoscope.daemon.ipc")

# Largest legitimate datagram: header + req header + MAX_PIDS pids. Anything bigger is garbage;
# the receive buffer is a little larger so that MSG_TRUNC tells us about oversized ones.
MAX_DATAGRAM = wire.METADATA.size + wire.REQ_HEADER.size + wire.PID.size * wire.MAX_PIDS
RECV_BUFFER = 1024
_UCRED = struct.Struct("=iII")  # pid_t pid; uid_t uid; gid_t gid
_ANC_SIZE = socket.CMSG_SPACE(_UCRED.size)
_CTXT_REPLY = struct.Struct("=i")
_MSG_TRUNC = int(socket.MSG_TRUNC)
_SOL_SOCKET = int(socket.SOL_SOCKET)
_SCM_CREDENTIALS = int(socket.SCM_CREDENTIALS)
_MAX_SOCKET_DIR = 54  # kineto copies dir + "/" + client name into a 108-byte sun_path unchecked


@dataclass(frozen=True)
class IpcEndpoint:
    """Where the daemon listens: abstract ``\\0<name>\\0`` or ``<socket_dir>/<name>``."""

    name: str = "dynolog"
    socket_dir: str | None = None  # KINETO_IPC_SOCKET_DIR; None or "" = abstract namespace

    @property
    def address(self) -> str | bytes:
        if self.socket_dir:
            return os.path.join(self.socket_dir, self.name)
        # Kineto's abstract address includes a trailing NUL in its length (docs/protocol.md §1.1).
        return b"\0" + self.name.encode() + b"\0"

    def describe(self) -> str:
        if self.socket_dir:
            return str(self.address)
        return f"@{self.name} (abstract)"


def lock_endpoint(endpoint: IpcEndpoint) -> int | None:
    """Hold ``<socket dir>/<name>.lock`` (``flock``, with this daemon's pid in it) for a
    filesystem endpoint; None for an abstract one (the kernel refuses a second bind there).

    Why: binding a filesystem socket unlinks the old one first, so a second daemon on the same
    directory used to take the socket from a running one, which kept running, deaf (issue 32).
    Raises KinetoscopeError naming the running daemon's pid. The caller closes the fd to unlock.
    """
    if not endpoint.socket_dir:
        return None
    os.makedirs(endpoint.socket_dir, exist_ok=True)
    path = os.path.join(endpoint.socket_dir, endpoint.name + ".lock")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise KinetoscopeError(f"cannot open the IPC lock file {path}: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise KinetoscopeError(
                f"IPC endpoint {endpoint.describe()} is in use by another kscope daemon (pid {holder}, "
                f"lock {path}); its socket is left alone. Stop it, or give this one another "
                "--ipc-socket-dir"
            ) from None
        raise KinetoscopeError(f"cannot lock {path}: {exc.strerror or exc}") from exc
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _refuse_live_socket(path: str, endpoint: IpcEndpoint) -> None:
    """Refuse when something (a dynolog, which takes no lock) still receives on ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)
    except OSError:
        return  # nothing there, or a stale socket nobody receives on
    finally:
        probe.close()
    raise KinetoscopeError(
        f"IPC endpoint {endpoint.describe()} is in use: a process (dynolog --enable_ipc_monitor?) "
        "receives on it; its socket is left alone. Stop it, or use another --ipc-socket-dir"
    )


def bind_endpoint(endpoint: IpcEndpoint) -> socket.socket:
    """Create, bind and configure the datagram socket. Raises KinetoscopeError with advice."""
    if not endpoint.name or "/" in endpoint.name or "\0" in endpoint.name:
        raise KinetoscopeError(f"invalid IPC endpoint name {endpoint.name!r}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        if endpoint.socket_dir:
            path = str(endpoint.address)
            if len(endpoint.socket_dir) > _MAX_SOCKET_DIR:
                log.warning(
                    "KINETO_IPC_SOCKET_DIR %s is longer than %d characters: libkineto clients "
                    "overflow their 108-byte socket path there and cannot connect",
                    endpoint.socket_dir,
                    _MAX_SOCKET_DIR,
                )
            os.makedirs(endpoint.socket_dir, exist_ok=True)
            _refuse_live_socket(path, endpoint)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            sock.bind(path)
            os.chmod(path, 0o666)  # clients run as other users (docs/protocol.md §1.1)
        else:
            sock.bind(endpoint.address)
    except (OSError, KinetoscopeError) as exc:
        sock.close()
        if isinstance(exc, KinetoscopeError):
            raise
        if exc.errno == errno.EADDRINUSE:
            raise KinetoscopeError(
                f"IPC endpoint {endpoint.describe()} is already in use: another kscope daemon or "
                "dynolog (--enable_ipc_monitor) runs on this host/network namespace; stop it, or "
                "use --ipc-socket-dir / --ipc-name"
            ) from exc
        raise KinetoscopeError(f"cannot bind IPC endpoint {endpoint.describe()}: {exc}") from exc
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    try:  # room for bursts (the queue length itself is net.unix.max_dgram_qlen)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    except OSError:
        pass
    sock.setblocking(False)
    return sock


class IpcServer:
    """Serves "req" and "ctxt" datagrams on its own thread until ``stop()``."""

    def __init__(
        self,
        endpoint: IpcEndpoint,
        registry: Registry,
        metrics: DaemonMetrics,
        gc_period_s: float | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.registry = registry
        self.stats = metrics.ipc
        # GC runs inside this loop (no extra thread): a quarter of the timeout, 0.05-15 s.
        self.gc_period_s = gc_period_s or min(15.0, max(0.05, registry.gc_timeout_s / 4))
        self._sock: socket.socket | None = None
        self._lock_fd: int | None = None
        self._loop_thread = LoopThread("kscope-ipc")
        self._rl = RateLimitedLogger(log)

    def start(self) -> None:
        self._lock_fd = lock_endpoint(self.endpoint)
        try:
            self._sock = bind_endpoint(self.endpoint)
        except BaseException:
            self._unlock()
            raise
        self._loop_thread.start(self._loop)
        log.info("IPC fabric listening on %s", self.endpoint.describe())

    def stop(self) -> None:
        """Stop the loop, close the socket and unlink the filesystem socket file."""
        self._loop_thread.stop()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            if self.endpoint.socket_dir:
                try:
                    os.unlink(str(self.endpoint.address))
                except OSError:
                    pass
        self._unlock()
        self._loop_thread.close()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock; the file stays (removing it would race)
            self._lock_fd = None

    # ------------------------------------------------------------------ loop
    def _loop(self) -> None:
        assert self._sock is not None
        sel = selectors.DefaultSelector()
        sel.register(self._sock, selectors.EVENT_READ)
        sel.register(self._loop_thread.wake, selectors.EVENT_READ)
        next_gc = time.monotonic() + self.gc_period_s
        try:
            while not self._loop_thread.stopping.is_set():
                timeout = max(0.0, next_gc - time.monotonic())
                events = sel.select(timeout)
                if any(key.fileobj is self._sock for key, _ in events):
                    self._drain()
                if time.monotonic() >= next_gc:
                    self._gc()
                    next_gc = time.monotonic() + self.gc_period_s
        except Exception:  # pragma: no cover - a bug; keep the evidence, the daemon stops serving IPC
            log.exception("IPC loop crashed")
        finally:
            sel.close()

    def _gc(self) -> None:
        try:
            dead = self.registry.gc()
        except Exception:  # pragma: no cover
            log.exception("registry GC failed")
            return
        if dead:  # one line per GC round, however many keys a client invented
            shown = ", ".join(f"{p.pid} (job {p.job_id})" for p in dead[:10])
            more = f" and {len(dead) - 10} more" if len(dead) > 10 else ""
            log.info("%d processes stopped polling; forgotten: %s%s", len(dead), shown, more)
        self.stats.gc_removed += len(dead)

    def _drain(self) -> None:
        """Receive and answer every queued datagram, until the socket would block."""
        sock = self._sock
        assert sock is not None
        recvmsg = sock.recvmsg
        while True:
            try:
                data, anc, flags, addr = recvmsg(RECV_BUFFER, _ANC_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # pragma: no cover - e.g. ENOMEM; do not spin on it
                self._rl.warning("recv", "IPC recvmsg failed: %s", exc)
                return
            t0 = time.perf_counter()
            try:
                self._handle(data, anc, flags, addr, t0)
            except Exception:  # pragma: no cover - never let one datagram kill the loop
                self.stats.drop("error")
                self._rl.exception("handler", "error while handling a datagram")

    def _drop(self, reason: str, msg: str, *args: object) -> None:
        self.stats.drop(reason)
        self._rl.warning(reason, "dropped IPC datagram (" + reason + "): " + msg, *args)

    def _handle(
        self, data: bytes, anc: list[tuple[int, int, bytes]], flags: int, addr: object, t0: float
    ) -> None:
        # This runs for every poll of every rank: plain ints, no enum arithmetic, few calls.
        if flags & _MSG_TRUNC or len(data) > MAX_DATAGRAM:
            self._drop("oversized", "more than %d bytes", MAX_DATAGRAM)
            return
        try:
            msg_type, payload = wire.unpack_datagram(data)
        except wire.FrameError as exc:
            self._drop("malformed", "%s", exc)
            return
        sender_pid = sender_uid = None
        for level, ctype, cdata in anc:
            if level == _SOL_SOCKET and ctype == _SCM_CREDENTIALS and len(cdata) >= _UCRED.size:
                pid, uid, _gid = _UCRED.unpack_from(cdata)
                sender_pid, sender_uid = pid or None, uid
        # Dynolog compares the tag by prefix (memcmp "req"/3, "ctxt"/4).
        if msg_type[:3] == b"req":
            self._handle_req(payload, addr, sender_pid, t0, sender_uid)
        elif msg_type[:4] == b"ctxt":
            self._handle_ctxt(payload, addr, t0)
        else:
            self._drop("unknown_type", "type %r", msg_type[:32])

    def _handle_req(
        self, payload: bytes, addr: object, sender_pid: int | None, t0: float, sender_uid: int | None = None
    ) -> None:
        try:
            req = wire.parse_request(payload)
        except wire.FrameError as exc:
            self._drop("malformed", "%s", exc)
            return
        if not req.pids:
            # Dynolog logs "Missing pids parameter" and does not answer (docs/protocol.md §1.3).
            self._drop("no_pids", "req with n=0")
            return
        if len(req.pids) > MAX_PIDS_PER_PROCESS:  # Kineto sends 11 at most
            self._drop("too_many_pids", "req with %d pids (at most %d)", len(req.pids), MAX_PIDS_PER_PROCESS)
            return
        stats = self.stats
        stats.polls += 1
        reply = self.registry.poll(req.job_id, req.pids, req.config_type, sender_pid, sender_uid)
        if reply:
            stats.delivered += 1
            log.info("config delivered to pid %d (job %d)", req.pids[0], req.job_id)
        if self._reply(wire.pack_datagram(wire.TYPE_REQ, reply.encode()), addr):
            stats.observe_latency(time.perf_counter() - t0)

    def _handle_ctxt(self, payload: bytes, addr: object, t0: float) -> None:
        try:
            ctx = wire.parse_context(payload)
        except wire.FrameError as exc:
            self._drop("malformed", "%s", exc)
            return
        self.stats.contexts += 1
        try:
            count = self.registry.register_context(ctx.job_id, ctx.gpu, ctx.pid)
        except Exception:  # pragma: no cover - Dynolog answers -1 when registration throws
            count = -1
        if self._reply(wire.pack_datagram(wire.TYPE_CTXT, _CTXT_REPLY.pack(count)), addr):
            self.stats.observe_latency(time.perf_counter() - t0)

    def _reply(self, datagram: bytes, addr: object) -> bool:
        """Non-blocking send to the poller's bound address; failures are the client's problem."""
        if not addr:
            self._drop("unbound_sender", "sender has no address to reply to")
            return False
        try:
            self._sock.sendto(datagram, addr)  # type: ignore[union-attr,call-overload]
        except OSError as exc:
            # ENOENT/ECONNREFUSED: client socket gone; EAGAIN: its queue is full.
            self.stats.reply_errors += 1
            self._rl.warning("send", "cannot reply to %r: %s", addr, exc)
            return False
        self.stats.replies += 1
        return True
