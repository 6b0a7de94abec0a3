"""Parse one large trace file with several worker processes (chunk-level parallelism).

The main process reads and inflates the file (ISA-L, ~2.7 GB/s) and cuts the ``traceEvents``
array into ~4 MiB chunks at candidate event boundaries (:class:`~kinetoscope.trace.decode.
EventStream`). Each chunk is copied into a shared-memory slot of a worker process, which
decodes it with msgspec and builds its Polars frames exactly as the in-process loader does
(:class:`~kinetoscope.trace.tables.TableBuilder`, with chunk-local event indices and pid/tid
labels), and sends them back as Arrow IPC streams over a pipe. The main process takes the
results in file order, shifts the indices, maps the labels to the file's numbering and links
the frames (no copy of the tables).

Workers are separate interpreters (``python -m kinetoscope.trace._chunkworker``), never forks
of a process whose Polars thread pool is running. They are started once per process, on the
first large file (or by :func:`prestart`), stay idle between files and exit with the main
process. While none is ready the main process decodes chunks itself, so a cold start never
waits for them.

Correctness does not depend on the workers: a chunk is sent before anyone knows that its first
byte is a real event start. Because the first chunk starts at a real event and a chunk that
decodes completely ends at a real event boundary, every chunk before the first failed one is
right; the first chunk a worker cannot handle (a boundary inside a string or nested value, the
end of the array, a syntax error, an odd event that the reference rules must judge, a worker
that died) is decoded in the main process with the serial rules, and the chunks sent after it
are dropped. Errors, offsets and event indices are therefore those of the serial loader.

Memory: at most ``slots`` chunks per worker are in flight; their bytes stay in the main
process's buffer until their results are taken.
"""

from __future__ import annotations

import atexit
import io
import mmap
import os
import queue
import struct
import subprocess
import sys
import tempfile
import threading
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

_HDR = struct.Struct("<I")
_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder()
TABLES = ("events", "flows", "counters", "instants", "meta_rows")

DEFAULT_SLOTS = 3  # chunks in flight per worker
# a worker that sends nothing for this long is taken for hung: killed, its chunks done here
RESULT_TIMEOUT_S = 120.0
# chunks built by workers, chunks they could not handle (decoded in the main process instead),
# chunks dropped after such a failure; pools started
STATS: Counter[str] = Counter()
PIPE_BYTES = 1 << 20  # pipe buffer size asked for (Linux), fewer reads per result


def _env_workers() -> int | None:
    v = os.environ.get("KSCOPE_LOAD_WORKERS")
    if v is None or v.strip() == "":
        return None
    try:
        return max(0, int(v))
    except ValueError:
        return None


def default_workers() -> int:
    """Worker processes for one large file: ``$KSCOPE_LOAD_WORKERS``, else one per CPU (the
    main process mostly inflates and copies), at most 8."""
    n = _env_workers()
    if n is not None:
        return n
    return max(1, min(os.cpu_count() or 1, 8))


@dataclass
class BuiltChunk:
    """A worker's tables for one chunk: chunk-local ``idx`` (0-based) and pid/tid labels."""

    n_events: int
    frames: dict[str, Any]
    labels: list[tuple[str, int]]  # (text, chunk-local id) in order of first appearance
    out_of_range: int
    warn: dict[str, int]
    slow: int
    exact: int
    first_index: int = 0  # set by the stream when the chunk is taken, in order
    end: int | None = None  # the array ended in this chunk: absolute offset after its ']'


# ---------------------------------------------------------------------------------------------
# main process side
# ---------------------------------------------------------------------------------------------
def _shared_file(size: int) -> int:
    """A file descriptor of ``size`` bytes of shared memory with no name on disk."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("kscope-chunks", 0)
    else:  # pragma: no cover - macOS etc.
        fh = tempfile.TemporaryFile()
        fd = os.dup(fh.fileno())
        fh.close()
    os.ftruncate(fd, size)
    return fd


def _read_exact(fh: Any, n: int) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = fh.readinto(view[got:])
        if not k:
            return None
        got += k
    view.release()
    return bytes(buf) if n < 4096 else buf  # type: ignore[return-value]


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    import kinetoscope

    root = os.path.dirname(os.path.dirname(os.path.abspath(kinetoscope.__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["POLARS_MAX_THREADS"] = "1"  # one core per worker; the main process keeps its pool
    for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = "1"
    env["KSCOPE_LOAD_WORKERS"] = "0"  # (a worker never starts workers)
    return env


class _Zygote:
    """A fork server: an interpreter that has imported the loader (Polars included, but has
    never run a Polars operation, so it has no thread pool) and forks a worker on request in
    a few milliseconds. Starting it costs one interpreter start-up (~0.3-0.7 s of CPU), paid
    once per process and in the background."""

    def __init__(self) -> None:
        import socket

        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock = parent
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kinetoscope.trace._zygote", str(child.fileno())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(child.fileno(),),
            env=_worker_env(),
        )
        child.close()
        self.ready = False
        self.alive = True

    def wait_ready(self) -> bool:
        with self.lock:
            if not self.ready and self.alive:
                try:
                    self.ready = self.sock.recv(1) == b"R"
                except OSError:
                    self.ready = False
                self.alive = self.ready
            return self.ready

    def fork(self, fds: tuple[int, ...], slots: int, slot_bytes: int) -> int | None:
        """A new worker process using ``fds`` (shared memory, commands in, results out)."""
        import socket

        if not self.wait_ready():
            return None
        with self.lock:
            try:
                socket.send_fds(self.sock, [struct.pack("<II", slots, slot_bytes)], list(fds))
                raw = b""
                while len(raw) < 4:
                    got = self.sock.recv(4 - len(raw))
                    if not got:
                        raise OSError("fork server gone")
                    raw += got
            except OSError:
                self.alive = False
                return None
        (pid,) = struct.unpack("<i", raw)
        return pid if pid > 0 else None

    def close(self) -> None:
        self.alive = False
        try:
            self.sock.close()
        except OSError:  # pragma: no cover
            pass
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:  # pragma: no cover
            self.proc.kill()


_ZYGOTE: _Zygote | None = None
_ZLOCK = threading.Lock()


def _zygote() -> _Zygote | None:
    global _ZYGOTE
    if not hasattr(os, "fork") or not hasattr(__import__("socket"), "send_fds"):
        return None  # pragma: no cover - Windows
    with _ZLOCK:
        if _ZYGOTE is not None and not (_ZYGOTE.alive and _ZYGOTE.proc.poll() is None):
            _ZYGOTE.close()
            _ZYGOTE = None
        if _ZYGOTE is None:
            try:
                _ZYGOTE = _Zygote()
            except OSError:  # pragma: no cover
                return None
            STATS["fork servers"] += 1
        return _ZYGOTE


class _Worker:
    """One worker process: a shared-memory area of ``slots`` chunk slots, a command pipe and
    a result pipe read by a thread of this process."""

    def __init__(self, index: int, slots: int, slot_bytes: int, zygote: _Zygote | None) -> None:
        self.index = index
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.ready = threading.Event()
        self.alive = False
        self.results: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.sent = 0  # chunks sent (ever)
        self.done = 0  # results received by the reader thread (ever)
        self.pid: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        fd = _shared_file(slots * slot_bytes)
        self.shm = mmap.mmap(fd, slots * slot_bytes)
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        for pfd in (cmd_w, res_r):
            try:  # bigger pipe buffers: fewer system calls per result
                import fcntl

                fcntl.fcntl(pfd, 1031, PIPE_BYTES)  # F_SETPIPE_SZ
            except (ImportError, OSError, AttributeError):
                pass
        try:
            if zygote is not None:
                self.pid = zygote.fork((fd, cmd_r, res_w), slots, slot_bytes)
            if self.pid is None:  # no fork server: a fresh interpreter
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "kinetoscope.trace._chunkworker"]
                    + [str(x) for x in (fd, cmd_r, res_w, slots, slot_bytes)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    pass_fds=(fd, cmd_r, res_w),
                    env=_worker_env(),
                )
                self.pid = self.proc.pid
        finally:
            for x in (fd, cmd_r, res_w):
                os.close(x)
        self.stdin = os.fdopen(cmd_w, "wb", buffering=0)
        self.stdout = os.fdopen(res_r, "rb", buffering=0)
        self.alive = True
        self.reader = threading.Thread(target=self._read, name=f"kscope-chunk-reader-{index}", daemon=True)
        self.reader.start()

    def kill(self) -> None:
        """(tests) Kill the process abruptly."""
        import signal

        if self.pid:
            os.kill(self.pid, signal.SIGKILL)

    def _read(self) -> None:
        out = self.stdout
        try:
            while True:
                raw = _read_exact(out, 4)
                if raw is None:
                    break
                (n,) = _HDR.unpack(raw)
                hdr = _read_exact(out, n)
                if hdr is None:
                    break
                msg = _DEC.decode(hdr)
                if msg.get("op") == "ready":
                    self.ready.set()
                    continue
                size = msg.get("payload", 0)
                payload = _read_exact(out, size) if size else b""
                if payload is None:
                    break
                self.done += 1
                self.results.put((msg, payload))
        except (OSError, ValueError, msgspec.DecodeError):
            pass
        self.alive = False
        self.ready.set()
        self.results.put(None)

    def send(self, msg: dict[str, Any]) -> bool:
        if not self.alive:
            return False
        data = _ENC.encode(msg)
        try:
            self.stdin.write(_HDR.pack(len(data)) + data)
        except (OSError, ValueError):
            self.alive = False
            return False
        return True

    def free_slots(self) -> int:
        return self.slots - (self.sent - self.done)

    def usable(self) -> bool:
        return self.alive and self.ready.is_set()

    def close(self) -> None:
        self.send({"op": "exit"})
        for f in (self.stdin,):
            try:
                f.close()
            except OSError:  # pragma: no cover
                pass
        self.reader.join(timeout=5)  # the worker closes its end when it exits
        try:
            self.stdout.close()
        except OSError:  # pragma: no cover
            pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:  # pragma: no cover
                self.proc.kill()
        try:
            self.shm.close()
        except (BufferError, ValueError):  # pragma: no cover
            pass


class ChunkPool:
    """``n`` worker processes for :meth:`EventStream._events_parallel`. They are created in a
    background thread (fork server start-up, then one fork each), so creating a pool never
    blocks; ``workers`` fills in as they come up."""

    def __init__(self, n: int, *, slots: int = DEFAULT_SLOTS, slot_bytes: int | None = None) -> None:
        from kinetoscope.trace.decode import CHUNK_BYTES

        self.n = n
        self.slots = slots
        self.slot_bytes = slot_bytes or (2 * CHUNK_BYTES + 4096)
        self.workers: list[_Worker] = []
        self.busy = False
        self.closed = False
        self.started = threading.Event()
        self.starter = threading.Thread(target=self._start, name="kscope-chunk-pool-start", daemon=True)
        self.starter.start()

    def _start(self) -> None:
        try:
            zyg = _zygote()
            for i in range(self.n):
                if self.closed:
                    break
                try:
                    self.workers.append(_Worker(i, self.slots, self.slot_bytes, zyg))
                except OSError:  # pragma: no cover
                    break
        finally:
            self.started.set()

    @property
    def capacity(self) -> int:
        return sum(w.slots for w in self.workers)

    def healthy(self) -> bool:
        """No worker has died (workers still starting count as healthy)."""
        return not any(not w.alive and w.ready.is_set() for w in self.workers)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until every worker is up (tests, benchmarks, prestart)."""
        if not self.started.wait(timeout):
            return False
        for w in self.workers:
            if not w.ready.wait(timeout):
                return False
        return len(self.workers) == self.n and all(w.alive for w in self.workers)

    def begin(self, path: str) -> _Job:
        return _Job(self, path)

    def close(self) -> None:
        self.closed = True
        self.starter.join(timeout=30)
        for w in self.workers:
            w.close()
        self.workers = []


@dataclass
class _Pending:
    seq: int
    worker: _Worker
    offset: int  # absolute offset of the chunk's first byte
    final: bool  # the rest of the data: the array must end in it


@dataclass
class _Job:
    """One file's chunks in flight (created by :meth:`ChunkPool.begin`)."""

    pool: ChunkPool
    path: str
    inflight: deque[_Pending] = field(default_factory=deque)
    seq: int = 0
    failed_at: int | None = None  # offset of the first chunk a worker could not handle
    dropped: set[tuple[int, int]] = field(default_factory=set)  # (worker, seq) to ignore
    announced: set[int] = field(default_factory=set)  # workers told about this file

    def can_submit(self) -> bool:
        return self.failed_at is None and any(w.usable() and w.free_slots() > 0 for w in self.pool.workers)

    def in_flight(self) -> bool:
        return bool(self.inflight)

    def oldest_offset(self) -> int | None:
        return self.inflight[0].offset if self.inflight else None

    def submit(self, data: memoryview, offset: int, final: bool = False) -> bool:
        """Copy the chunk's events text into a worker's slot and ask it to build the tables."""
        n = len(data)
        best = None
        for w in self.pool.workers:
            if w.usable() and w.free_slots() > 0 and n + 2 <= w.slot_bytes:
                if best is None or w.free_slots() > best.free_slots():
                    best = w
        if best is None:
            return False
        w = best
        if w.index not in self.announced:
            if not w.send({"op": "file", "path": self.path}):
                return False
            self.announced.add(w.index)
        slot = w.sent % w.slots
        base = slot * w.slot_bytes
        shm = w.shm
        shm[base] = 0x5B  # '['
        shm[base + 1 : base + 1 + n] = data
        shm[base + 1 + n] = 0x5D  # ']'
        seq = self.seq
        if not w.send({"op": "chunk", "seq": seq, "slot": slot, "len": n + 2}):
            return False
        w.sent += 1
        self.seq += 1
        self.inflight.append(_Pending(seq, w, offset, final))
        return True

    def has_result(self) -> bool:
        if not self.inflight:
            return False
        p = self.inflight[0]
        return not p.worker.results.empty() or not p.worker.alive

    def _get(self, p: _Pending) -> tuple[dict[str, Any], Any] | None:
        """The result of ``p`` from its worker (skipping results of dropped chunks)."""
        w = p.worker
        while True:
            item = _get_or_kill(w)
            if item is None:  # the worker is gone
                w.results.put(None)
                return None
            msg, payload = item
            if (w.index, msg["seq"]) in self.dropped:
                self.dropped.discard((w.index, msg["seq"]))
                continue
            if msg["seq"] != p.seq:  # pragma: no cover - protocol error: treat as failure
                return None
            return msg, payload

    def take(self) -> BuiltChunk | None:
        """The oldest chunk's tables (blocks), or None when it failed: ``failed_at`` then says
        where the main process must continue, and the chunks after it are dropped."""
        p = self.inflight.popleft()
        got = self._get(p)
        if got is not None and got[0].get("ok"):
            end = got[0].get("end")
            if end is not None or not p.final:  # (a last chunk must hold the array's end)
                STATS["built"] += 1
                res = _unpack(*got)
                if end is not None:  # in the slot: '[' + data, so data byte i is slot byte i+1
                    res.end = p.offset + end - 1
                return res
        self.failed_at = p.offset
        STATS["failed"] += 1
        STATS["dropped"] += len(self.inflight)
        for q in self.inflight:
            self.dropped.add((q.worker.index, q.seq))
        self.inflight.clear()
        return None

    def drain(self) -> Iterator[BuiltChunk | None]:
        """Every chunk in flight, in order; stops after the first failure (yielding None)."""
        while self.inflight:
            res = self.take()
            yield res
            if res is None:
                return

    def close(self) -> None:
        """Drop what is still in flight and wait for the workers to finish it, so that they are
        idle (and in step) for the next file."""
        for q in self.inflight:
            self.dropped.add((q.worker.index, q.seq))
        self.inflight.clear()
        for w in self.pool.workers:
            while any(wi == w.index for wi, _ in self.dropped):
                item = _get_or_kill(w)
                if item is None:
                    w.results.put(None)
                    self.dropped = {d for d in self.dropped if d[0] != w.index}
                    break
                self.dropped.discard((w.index, item[0]["seq"]))
        self.pool.busy = False


def _get_or_kill(w: _Worker) -> Any:
    """The next message of ``w`` (None when it is gone; a hung worker is killed)."""
    try:
        return w.results.get(timeout=RESULT_TIMEOUT_S)
    except queue.Empty:
        STATS["hung"] += 1
        try:
            w.kill()
        except OSError:  # pragma: no cover
            pass
        w.alive = False
        return None


def _unpack(msg: dict[str, Any], payload: Any) -> BuiltChunk:
    import polars as pl

    frames = {}
    view = memoryview(payload)
    pos = 0
    for name, size in msg["tables"]:
        frames[name] = pl.read_ipc_stream(io.BytesIO(view[pos : pos + size]))
        pos += size
    view.release()
    return BuiltChunk(
        n_events=msg["n"],
        frames=frames,
        labels=[tuple(x) for x in msg["labels"]],
        out_of_range=msg["oor"],
        warn=msg["warn"],
        slow=msg["slow"],
        exact=msg["exact"],
    )


_POOL: ChunkPool | None = None
_LOCK = threading.Lock()


def get_pool(n: int | None = None, *, start: bool = True) -> ChunkPool | None:
    """The process's worker pool (started on first use with ``n`` workers), or None when
    workers are disabled (``KSCOPE_LOAD_WORKERS=0``), not started yet (``start=False``), in
    use by another thread, or all dead."""
    global _POOL
    n = default_workers() if n is None else n
    if n <= 0:
        return None
    with _LOCK:
        if _POOL is not None and (not _POOL.healthy() or _POOL.n != n):
            if _POOL.busy:
                return None
            _POOL.close()
            _POOL = None
        if _POOL is None:
            if not start:
                return None
            try:
                _POOL = ChunkPool(n)
            except OSError:
                return None
            STATS["pools"] += 1
        if _POOL.busy:
            return None
        _POOL.busy = True
        return _POOL


def release_pool(pool: ChunkPool) -> None:
    pool.busy = False


def prestart(n: int | None = None) -> None:
    """Start the worker processes now (in the background), so that the first large file
    does not pay their start-up (~0.3-1 s: a Python interpreter importing Polars)."""
    pool = get_pool(n)
    if pool is not None:
        release_pool(pool)


def shutdown() -> None:
    """Stop the workers and the fork server (at exit; tests)."""
    global _POOL, _ZYGOTE
    with _LOCK:
        if _POOL is not None:
            _POOL.close()
            _POOL = None
    with _ZLOCK:
        if _ZYGOTE is not None:
            _ZYGOTE.close()
            _ZYGOTE = None


atexit.register(shutdown)


# ---------------------------------------------------------------------------------------------
# worker process side
# ---------------------------------------------------------------------------------------------
class _ViewSource:
    """``redecode`` for a chunk held in a worker's slot (see DecodedChunk.redecode)."""

    def __init__(self, view: memoryview, family: Any) -> None:
        self.view = view
        self.family = family

    def redecode(self, chunk: Any, decoder: Any, *, copy: bool = False) -> list[Any]:
        events: list[Any] = decoder.decode(bytes(self.view) if copy else self.view)
        return events


def build_chunk(builder: Any, view: memoryview, family: Any) -> tuple[Any, dict[str, Any], list[bytes]]:
    """Decode one chunk (``[`` events ``]``) and build its frames with ``builder``. Returns
    (the family to use next, the result header, the IPC payloads). Raises on anything that
    the main process must handle itself."""
    from kinetoscope.trace import _native
    from kinetoscope.trace import decode as D

    if _native.enabled():  # the C decoder (it gives up on anything the Python rules must judge)
        got = _native.decode(view)
        if got is not None:
            return family, *_result(got.frames, got.n_events, got.labels, 0, {}, 0, 0, got.end)
    fam = D.sniff_family(view, family)
    end = None
    try:
        events, typed = _decode(view, fam)
    except msgspec.DecodeError as exc:
        # the array closed inside this chunk (its start is a real event start, or the main
        # process drops this result): the events up to its ']'
        b = D.error_byte(exc)
        if "trailing characters" not in str(exc) or b is None:
            raise
        end = b - 1
        view = view[:end]
        events, typed = _decode(view, fam)
    source = _ViewSource(view, fam)
    chunk = D.DecodedChunk(events, 0, typed, 0, fam, source=source)
    builder.reset_chunk()
    builder.add(chunk)
    n = len(events)
    del events, chunk
    frames = {}
    for name in TABLES:
        got = getattr(builder, name)
        if got:
            frames[name] = (
                got[0] if len(got) == 1 else __import__("polars").concat(got, how="diagonal_relaxed")
            )
    ids = builder.ids
    labels = list(ids.labels.items())
    warn = dict(builder.warn)
    return source.family, *_result(
        frames, n, labels, ids.out_of_range, warn, builder.slow_chunks, builder.exact_chunks, end
    )


def _result(
    frames: dict[str, Any],
    n: int,
    labels: list[Any],
    oor: int,
    warn: dict[str, int],
    slow: int,
    exact: int,
    end: int | None,
) -> tuple[dict[str, Any], list[bytes]]:
    """A chunk's frames as the result message: (header, Arrow IPC payloads)."""
    payloads = []
    tables = []
    for name in TABLES:
        df = frames.get(name)
        if df is None:
            continue
        bio = io.BytesIO()
        df.write_ipc_stream(bio, compression="uncompressed")
        b = bio.getvalue()
        payloads.append(b)
        tables.append((name, len(b)))
    hdr = {
        "ok": True,
        "n": n,
        "labels": labels,
        "oor": oor,
        "warn": warn,
        "slow": slow,
        "exact": exact,
        "tables": tables,
        "payload": sum(map(len, payloads)),
        "end": end,
    }
    return hdr, payloads


def _decode(view: memoryview, fam: Any) -> tuple[list[Any], bool]:
    from kinetoscope.trace import decode as D

    try:
        return fam.decoder.decode(bytes(view) if fam.raw_ts else view), True
    except msgspec.ValidationError:
        return D.EXACT_GENERIC_DECODER.decode(view), False


_WARMUP = (
    b'[{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1712171498123456.789, "dur": 1.5,'
    b' "args": {"stream": 7, "correlation": 9, "grid": [1, 2, 3], "blocks per SM": 0.5, "External id": 3}},'
    b' {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": "Spans", "tid": 1, "ts": 1712171498123450.001,'
    b' "dur": 9, "args": {"Input Dims": [[1, 2], []], "Input type": ["float", ""], "External id": 3}},'
    b' {"ph": "s", "id": 9, "pid": 1, "tid": 1, "ts": 1712171498123450.5, "cat": "ac2g", "name": "ac2g"},'
    b' {"ph": "f", "id": 9, "pid": 0, "tid": 7, "ts": 1712171498123456.789, "cat": "ac2g", "name": "ac2g", "bp": "e"},'
    b' {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1712171498123457, "args": {"Bytes": 8}},'
    b' {"ph": "C", "name": "q", "pid": 1, "ts": 1712171498123458, "args": {"v": 1}},'
    b' {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}}]'
)


def worker_loop(fd: int, in_fd: int, out_fd: int, slots: int, slot_bytes: int) -> None:  # pragma: no cover
    """The worker process: commands on ``in_fd``, results on ``out_fd``, chunks in the
    shared memory ``fd`` (runs in the worker; tested end to end)."""
    import gc

    gc.disable()
    shm = mmap.mmap(fd, slots * slot_bytes)
    os.close(fd)
    inp = os.fdopen(in_fd, "rb")
    out = os.fdopen(out_fd, "wb")

    def send(msg: dict[str, Any], payloads: list[bytes] = ()) -> None:  # type: ignore[assignment]
        data = _ENC.encode(msg)
        out.write(_HDR.pack(len(data)) + data)
        for p in payloads:
            out.write(p)
        out.flush()

    from kinetoscope.trace import decode as D
    from kinetoscope.trace.tables import TableBuilder

    try:  # first use of every code path (Polars, IPC writer, ...) before any real chunk
        build_chunk(TableBuilder("warm-up"), memoryview(_WARMUP), D.FLOAT)
    except Exception:  # noqa: BLE001 - only a warm-up
        pass
    send({"op": "ready"})
    builder = None
    family = D.FLOAT
    whole = memoryview(shm)
    while True:
        raw = inp.read(4)
        if len(raw) < 4:
            break
        (n,) = _HDR.unpack(raw)
        msg = _DEC.decode(inp.read(n))
        op = msg.get("op")
        if op == "exit":
            break
        if op == "file":
            builder = TableBuilder(msg["path"])
            family = D.FLOAT
            gc.collect()
            continue
        if op != "chunk":
            continue
        seq = msg["seq"]
        base = msg["slot"] * slot_bytes
        view = whole[base : base + msg["len"]]
        try:
            assert builder is not None
            family, hdr, payloads = build_chunk(builder, view, family)
            hdr["seq"] = seq
            send(hdr, payloads)
        except Exception as exc:  # noqa: BLE001 - any problem: the main process decodes it
            send({"seq": seq, "ok": False, "why": f"{type(exc).__name__}: {exc}"[:300]})
        finally:
            view.release()


def worker_main() -> None:  # pragma: no cover - a worker started as a fresh interpreter
    worker_loop(*(int(x) for x in sys.argv[1:6]))


def zygote_main() -> None:  # pragma: no cover - the fork server process
    import signal
    import socket
    import warnings

    sock = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped automatically
    from kinetoscope.trace import decode, tables  # noqa: F401 - what every worker needs

    sock.sendall(b"R")
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, 8, 3)
        except OSError:
            break
        if len(msg) < 8 or len(fds) != 3:
            for f in fds:
                os.close(f)
            break
        slots, slot_bytes = struct.unpack("<II", msg)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (Python >= 3.12 warns about fork with threads)
            pid = os.fork()
        if pid == 0:
            code = 0
            try:
                sock.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                worker_loop(fds[0], fds[1], fds[2], slots, slot_bytes)
            except BaseException:  # noqa: BLE001
                code = 1
            finally:
                os._exit(code)
        for f in fds:
            os.close(f)
        sock.sendall(struct.pack("<i", pid))
