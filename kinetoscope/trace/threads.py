"""Chunks decoded by the native decoder in threads of this process.

The C decoder releases the GIL while it scans a chunk (``_decoder.decode_chunk``), which is
most of a native parse; so on a machine with two or more CPUs, threads decode the next chunks
while this thread reads, splits and links the previous ones. :class:`ThreadChunkPool` has the
interface of :class:`kinetoscope.trace.parallel.ChunkPool` (``begin`` -> a job with
``submit``/``take``/...), so ``EventStream._events_parallel`` drives it with the same rules as
the worker processes: chunks are cut at candidate boundaries and sent speculatively, results
are taken in file order, and the first chunk the decoder gives back (a boundary inside a string
or a nested value, anything the Python rules must judge) is decoded by the serial path from
its start, the chunks after it dropped. A thread's result is the very ``NativeChunk`` the
serial path would build from the same bytes, so tables, metadata and warnings are identical
(tests/trace/test_threads.py). Unlike worker processes, threads cost nothing to start, so
they can pay off from a few chunks (:data:`kinetoscope.trace.loader.THREAD_FILE_MIN_BYTES`);
they are used only when ``$KSCOPE_LOAD_THREADS`` asks for them (see :func:`default_threads`).
"""

from __future__ import annotations

import os
import threading
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kinetoscope.trace import _native

MAX_THREADS = 4
STATS: Counter[str] = Counter()  # chunks taken from the threads: "built", "failed" (tests)


def default_threads() -> int:
    """Decoding threads: ``$KSCOPE_LOAD_THREADS`` (at most 4), else none. Off by default: on
    the shared 2-core box threads cost 10-22 % more CPU (the copies, the hand-offs) and more
    peak memory (a chunk copy in flight per thread), and were faster only while cores were
    idle, by at most 8 % (docs/performance.md, issue 14 third step)."""
    text = os.environ.get("KSCOPE_LOAD_THREADS", "").strip()
    return min(MAX_THREADS, int(text)) if text.isdigit() else 0


def _decode(data: bytearray) -> _native.NativeChunk | None:
    return _native.decode(data)


@dataclass
class _Pending:
    future: Future[_native.NativeChunk | None]
    offset: int  # absolute offset of the chunk's first byte
    final: bool  # the rest of the data: the array must end in it


class ThreadChunkPool:
    """``n`` decoding threads; at most ``capacity`` chunks (copies of ~4 MiB) in flight."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.busy = False
        self.executor = ThreadPoolExecutor(n, thread_name_prefix="kscope-decode")

    @property
    def capacity(self) -> int:
        return self.n + 1

    def begin(self, path: str) -> ThreadJob:
        _native.configure()  # here, never in a thread while another one decodes
        return ThreadJob(self, path)

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


@dataclass
class ThreadJob:
    """One file's chunks in flight (see :class:`kinetoscope.trace.parallel._Job`)."""

    pool: ThreadChunkPool
    path: str
    inflight: deque[_Pending] = field(default_factory=deque)
    failed_at: int | None = None  # offset of the first chunk the decoder gave back

    def can_submit(self) -> bool:
        return self.failed_at is None and len(self.inflight) < self.pool.capacity

    def in_flight(self) -> bool:
        return bool(self.inflight)

    def oldest_offset(self) -> int | None:
        return self.inflight[0].offset if self.inflight else None

    def submit(self, data: memoryview, offset: int, final: bool = False) -> bool:
        """Copy the chunk's events text as ``[`` events ``]`` and decode it in a thread."""
        buf = bytearray(len(data) + 2)
        buf[0] = 0x5B  # '['
        buf[1:-1] = data
        buf[-1] = 0x5D  # ']'
        self.inflight.append(_Pending(self.pool.executor.submit(_decode, buf), offset, final))
        return True

    def has_result(self) -> bool:
        return bool(self.inflight) and self.inflight[0].future.done()

    def take(self) -> Any:
        """The oldest chunk's frames (waits for them), or None when the decoder gave it back:
        ``failed_at`` then says where the serial parse goes on, and the later chunks are dropped."""
        p = self.inflight.popleft()
        try:
            got = p.future.result()
        except Exception:  # noqa: BLE001 - e.g. MemoryError: the serial path decides and reports
            got = None
        if got is not None and (got.end is not None or not p.final):
            if got.end is not None:  # the copy is '[' + data, so data byte i is copy byte i+1
                got.end = p.offset + got.end - 1
            STATS["built"] += 1
            return got
        STATS["failed"] += 1
        self.failed_at = p.offset
        self._drop()
        return None

    def drain(self) -> Any:
        """Every chunk in flight, in order; stops after the first failure (yielding None)."""
        while self.inflight:
            res = self.take()
            yield res
            if res is None:
                return

    def _drop(self) -> None:
        for q in self.inflight:
            q.future.cancel()
        for q in self.inflight:
            if not q.future.cancelled():
                q.future.exception()  # wait: nothing of this file is decoded after the job
        self.inflight.clear()

    def close(self) -> None:
        self._drop()
        self.pool.busy = False


_POOL: ThreadChunkPool | None = None
_LOCK = threading.Lock()


def get_pool() -> ThreadChunkPool | None:
    """The process's decoding threads (made on first use), or None when there are none
    (``$KSCOPE_LOAD_THREADS`` unset or 0) or another parse is using them (it then runs serially)."""
    global _POOL
    n = default_threads()
    if n <= 0:
        return None
    with _LOCK:
        if _POOL is None or _POOL.n != n:
            if _POOL is not None:
                if _POOL.busy:
                    return None
                _POOL.close()
            _POOL = ThreadChunkPool(n)
        if _POOL.busy:
            return None
        _POOL.busy = True
        return _POOL
