"""``load_trace`` / ``load_traces``: trace files -> :class:`Trace` (fast, bounded memory, cached).

Pipeline: :class:`~kinetoscope.trace.reader.BlockReader` (ISA-L gunzip, 4 MiB blocks) ->
:class:`~kinetoscope.trace.decode.EventStream` (top-level metadata + ``traceEvents`` cut into
~4 MiB chunks, each decoded by the native C decoder into Arrow columns
(:mod:`kinetoscope.trace._native`), or, where it is not built or gives up, by msgspec into typed
structs) -> :class:`~kinetoscope.trace.tables.TableBuilder` (one Polars frame per table per chunk) ->
concatenation and metadata. Peak memory is the tables plus one chunk of Python objects, not
the whole document. Results are cached as Parquet keyed by the file's content
(:mod:`kinetoscope.trace.cache`).
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from kinetoscope.trace import _native
from kinetoscope.trace import cache as _cache
from kinetoscope.trace.compact import Columns, project
from kinetoscope.trace.decode import CHUNK_BYTES, EventStream
from kinetoscope.trace.discover import TraceList, check_ranks, expand_paths
from kinetoscope.trace.errors import TraceError
from kinetoscope.trace.limits import Limits
from kinetoscope.trace.metadata import apply_location
from kinetoscope.trace.model import Trace
from kinetoscope.trace.reader import BLOCK_BYTES, BlockReader, check_trace_file
from kinetoscope.trace.tables import TableBuilder, assemble_trace

if TYPE_CHECKING:
    from kinetoscope.trace.parallel import ChunkPool
    from kinetoscope.trace.threads import ThreadChunkPool

PathLike = str | os.PathLike[str]


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The decode allocates many short-lived containers; cyclic GC passes over them are wasted
    work (none are cyclic), so pause it for the duration of one parse."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# A file with at least this much JSON is parsed by worker processes (kinetoscope.trace.parallel);
# once the workers run (a previous large file, or prestart_workers()), files from
# PARALLEL_WARM_MIN_BYTES on use them too. Below, starting interpreters costs more than it saves.
PARALLEL_FILE_MIN_BYTES = 24 << 20
PARALLEL_WARM_MIN_BYTES = 8 << 20
# The same thresholds when the native decoder runs (kinetoscope.trace._native): it decodes a
# chunk ~4x faster than the Python path, so the workers' start-up and the copies to and from
# them pay off only for much larger files (measured: in-process was faster up to 350 MB of
# JSON on a 2-core box; docs/performance.md, "Analysis engine").
PARALLEL_NATIVE_FILE_MIN_BYTES = 2 << 30
PARALLEL_NATIVE_WARM_MIN_BYTES = 1 << 30


def estimated_json_bytes(path: str) -> int:
    """The JSON size of a trace file: the file size, or for gzip the size the trailer records
    (ISIZE, modulo 4 GiB: at least 15x the compressed size is assumed)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            if fh.read(2) != b"\x1f\x8b":
                return size
            if size < 20:
                return 0
            fh.seek(size - 4)
            isize = int.from_bytes(fh.read(4), "little")
    except OSError:
        return 0
    while isize < size * 15:
        isize += 1 << 32
        if isize > size * 2000:
            return size * 15
    return isize


# A file with at least this much JSON, parsed in this process by the native decoder, has its
# chunks decoded by threads (kinetoscope.trace.threads) when $KSCOPE_LOAD_THREADS asks for them
# and there are two CPUs or more: threads cost nothing to start, so a few chunks are enough.
THREAD_FILE_MIN_BYTES = 12 << 20


def _pool_for(path: str, workers: int | None, salvage: bool) -> ChunkPool | ThreadChunkPool | None:
    """The worker processes or decoding threads to parse ``path`` with, or None (all here)."""
    pool = _process_pool_for(path, workers, salvage)
    if pool is None and workers is None and not salvage and _native.enabled():
        return _thread_pool_for(path)
    return pool


def _thread_pool_for(path: str) -> ThreadChunkPool | None:
    if (os.cpu_count() or 1) < 2 or estimated_json_bytes(path) < THREAD_FILE_MIN_BYTES:
        return None
    from kinetoscope.trace import threads

    return threads.get_pool()


def _release(pool: ChunkPool | ThreadChunkPool) -> None:
    pool.busy = False  # (what parallel.release_pool does, without importing the worker machinery)


def _process_pool_for(path: str, workers: int | None, salvage: bool) -> ChunkPool | None:
    """The worker pool to parse ``path`` with, or None (parse in this process)."""
    if salvage or workers == 0:
        return None
    if workers is None and "kinetoscope.trace.parallel" not in sys.modules:
        # no pool can be running: decide on the size first, so that a small file never pays
        # for importing the worker machinery (start-up time of every command)
        cold = PARALLEL_NATIVE_FILE_MIN_BYTES if _native.enabled() else PARALLEL_FILE_MIN_BYTES
        if estimated_json_bytes(path) < cold:
            return None
    from kinetoscope.trace import parallel

    if workers is None:
        n = parallel.default_workers()
        if n <= 0 or (os.cpu_count() or 1) < 2:
            return None
        size = estimated_json_bytes(path)
        native = _native.enabled()
        warm = parallel.get_pool(n, start=False)
        if warm is not None:
            if size >= (PARALLEL_NATIVE_WARM_MIN_BYTES if native else PARALLEL_WARM_MIN_BYTES):
                return warm
            parallel.release_pool(warm)
            return None
        if size < (PARALLEL_NATIVE_FILE_MIN_BYTES if native else PARALLEL_FILE_MIN_BYTES):
            return None
        return parallel.get_pool(n)
    return parallel.get_pool(workers)


def prestart_workers(n: int | None = None) -> None:
    """Start the worker processes that parse large files now, in the background, so that the
    first large file does not wait for them (an interpreter importing Polars: ~0.3-1 s each).
    ``n``: how many (default ``$KSCOPE_LOAD_WORKERS``, else one per CPU, at most 8)."""
    from kinetoscope.trace import parallel

    if (os.cpu_count() or 1) >= 2 or n:
        parallel.prestart(n)


def parse_trace(
    path: PathLike,
    *,
    salvage: bool = False,
    locate: bool = True,
    chunk_bytes: int | None = None,
    block_bytes: int | None = None,
    workers: int | None = None,
    limits: Limits | None = None,
    columns: Columns | None = None,
) -> Trace:
    """Parse one file (no cache). ``salvage=True`` keeps the complete events of a truncated or
    damaged file and says what was lost in ``meta.warnings``. ``chunk_bytes``/``block_bytes``
    tune the decode chunk and decompression block sizes (tests use tiny ones). ``workers``:
    worker processes that decode chunks in parallel (0: none; None: automatic, for files of
    ``PARALLEL_FILE_MIN_BYTES`` of JSON or more; results are identical either way). ``limits``:
    the resource limits (:class:`~kinetoscope.trace.limits.Limits`; default: from the
    environment), exceeding one raises TraceError naming it. ``columns``: build only these
    tables and columns (:data:`~kinetoscope.trace.compact.Columns`; None: all): what is not
    kept is dropped chunk by chunk, so it never takes memory."""
    spath = os.fspath(path)
    check_trace_file(spath)  # a FIFO or device is refused before anything opens it
    pool = _pool_for(spath, workers, salvage)
    try:
        return _parse(spath, salvage, locate, chunk_bytes, block_bytes, pool, limits, columns)
    finally:
        if pool is not None:
            _release(pool)


def _parse(
    spath: str,
    salvage: bool,
    locate: bool,
    chunk_bytes: int | None,
    block_bytes: int | None,
    pool: ChunkPool | ThreadChunkPool | None,
    limits: Limits | None,
    columns: Columns | None = None,
) -> Trace:
    limits = limits or Limits.from_env()
    with (
        _gc_paused(),
        BlockReader(spath, salvage=salvage, block_bytes=block_bytes or BLOCK_BYTES, limits=limits) as reader,
    ):
        stream = EventStream(
            spath, reader, salvage=salvage, chunk_bytes=chunk_bytes or CHUNK_BYTES, pool=pool
        )
        builder = TableBuilder(spath, columns)
        cap, hint = limits.event_cap(reader.compressed_size())
        for chunk in stream.chunks():
            builder.add(chunk)
            if builder.n_events > cap:
                raise TraceError(
                    spath, f"traceEvents holds more than {cap} events: over {hint}", event_index=cap
                )
        tables = builder.finish()
        state = stream.state
        warnings = list(state.warnings)
        if state.salvaged is not None:
            warnings.insert(
                0,
                f"salvaged {stream.n_events} complete event(s) from a damaged file: {state.salvaged}",
            )
        elif reader.problem:
            warnings.insert(0, f"the JSON is complete but the compressed stream is damaged: {reader.problem}")
        return assemble_trace(
            spath,
            state.top,
            num_events=stream.n_events,
            ids=builder.ids,
            warn=builder.warn,
            extra_warnings=warnings,
            locate=locate,
            **tables,
        )


def load_trace(
    path: PathLike,
    *,
    cache: bool = True,
    salvage: bool = False,
    cache_dir: PathLike | None = None,
    workers: int | None = None,
    columns: Columns | None = None,
) -> Trace:
    """Load one Kineto / PyTorch Profiler trace (``.json`` or ``.json.gz``) into typed tables.

    ``cache=False`` forces a cold parse (and does not write the cache). ``salvage=True``
    recovers every complete event of a truncated file instead of raising. ``workers``: worker
    processes for a large file (see :func:`parse_trace`; None: automatic). ``columns``: keep
    only these tables and columns (:data:`~kinetoscope.trace.compact.Columns`); without the
    cache they are never built, with it the whole trace is loaded (and cached) first. Raises
    :class:`~kinetoscope.trace.errors.TraceError` naming the file and the byte offset or event
    index for anything that is not a readable trace.
    """
    spath = os.fspath(path)
    check_trace_file(spath)  # before the cache hashes it: a FIFO would block that read
    store = _cache.TraceCache(cache_dir) if cache else None
    key = None
    if store is not None:
        key = store.key_for(spath, salvage=salvage)
        if key is not None:
            hit = store.get(key)
            if hit is not None:
                apply_location(hit.meta, spath)
                return project(hit, columns)
    if store is None or key is None:
        trace = parse_trace(spath, salvage=salvage, locate=False, workers=workers, columns=columns)
    else:  # the cache holds whole traces
        trace = parse_trace(spath, salvage=salvage, locate=False, workers=workers)
        store.put(key, trace)
        project(trace, columns)
    apply_location(trace.meta, spath)
    return trace


def load_traces(
    paths: PathLike | Iterable[PathLike],
    *,
    cache: bool = True,
    salvage: bool = False,
    cache_dir: PathLike | None = None,
    workers: int | None = None,
) -> TraceList:
    """Load several traces (files and/or directories of ``*.json``/``*.json.gz``).

    Files that need parsing are parsed in parallel worker processes when there are several of
    them and enough work (``workers=None``: up to the number of CPUs; ``workers=1``: in this
    process). Workers hand their tables back through the Parquet cache (a private temporary
    one when ``cache=False``), so nothing is pickled.

    Ranks are checked across the set: a trace whose rank is unknown, or two traces claiming the
    same rank, get a warning in ``meta.warnings`` and an entry in the returned list's
    ``problems`` (a list of :class:`~kinetoscope.trace.discover.RankProblem`); all traces are
    kept, nothing is overwritten. The result is a :class:`~kinetoscope.trace.discover.TraceList`
    (a ``list[Trace]``).
    """
    files = expand_paths(paths)
    n = _worker_count(files, workers)
    if n <= 1:
        traces = [load_trace(f, cache=cache, salvage=salvage, cache_dir=cache_dir) for f in files]
    else:
        traces = _load_parallel(files, n, cache=cache, salvage=salvage, cache_dir=cache_dir)
    return TraceList(traces, check_ranks(traces))


PARALLEL_MIN_BYTES = 48 << 20  # estimated JSON bytes to parse before worker processes pay off
# the same with the native decoder: 8 files of 35 MB (280 MB) loaded faster in one process than
# in two worker interpreters (wall 4.8-6.8 s vs 6.3-12.0 s, CPU 1.8 s vs 3.2-3.5 s, RSS 360 vs
# 390 MB on the 2-core box; docs/performance.md)
PARALLEL_NATIVE_MIN_BYTES = 1 << 30


def _estimated_json_bytes(path: str) -> int:
    try:
        size = os.path.getsize(path)
    except OSError:
        return 0
    with open(path, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    return size * 15 if gz else size


def _worker_count(files: list[str], workers: int | None) -> int:
    if workers is not None:
        return max(1, min(workers, len(files)))
    if len(files) < 2:
        return 1
    if sum(_estimated_json_bytes(f) for f in files) < (
        PARALLEL_NATIVE_MIN_BYTES if _native.enabled() else PARALLEL_MIN_BYTES
    ):
        return 1
    return max(1, min(len(files), os.cpu_count() or 1, 16))


def _load_parallel(
    files: list[str], n: int, *, cache: bool, salvage: bool, cache_dir: PathLike | None
) -> list[Trace]:
    import shutil
    import tempfile

    tmp = None if cache else tempfile.mkdtemp(prefix="kscope-load-")
    root = os.fspath(cache_dir) if (cache and cache_dir is not None) else tmp
    store = _cache.TraceCache(root)
    try:
        keys: list[str | None] = [store.key_for(f, salvage=salvage) for f in files]
        todo = [i for i, k in enumerate(keys) if k is not None and not store.entry_dir(k).is_dir()]
        errors: dict[int, TraceError] = {}
        if len(todo) > 1:
            errors = _run_workers(files, keys, todo, min(n, len(todo)), salvage, str(store.root))
        traces = []
        for i, (f, k) in enumerate(zip(files, keys)):
            if i in errors:
                raise errors[i]
            hit = store.get(k) if k is not None else None
            if hit is not None:
                apply_location(hit.meta, f)
                traces.append(hit)
            else:  # worker could not store it (or was not used): parse here
                traces.append(load_trace(f, cache=cache, salvage=salvage, cache_dir=cache_dir))
        return traces
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _run_workers(
    files: list[str], keys: list[str | None], todo: list[int], n: int, salvage: bool, root: str
) -> dict[int, TraceError]:
    """Parse ``files[todo]`` into the cache at ``root`` with ``n`` worker interpreters
    (largest files first, each to the least loaded worker). Returns TraceErrors by index."""
    import subprocess
    import sys

    import orjson

    import kinetoscope

    bins: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for i in sorted(todo, key=lambda i: -_estimated_json_bytes(files[i])):
        w = load.index(min(load))
        bins[w].append(i)
        load[w] += _estimated_json_bytes(files[i])
    env = dict(os.environ)
    env["KSCOPE_LOAD_WORKERS"] = "0"  # file-level parallelism here: no chunk workers inside
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(kinetoscope.__file__)))
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    procs = []
    for b in bins:
        if not b:
            continue
        job = {"root": root, "jobs": [{"path": files[i], "key": keys[i], "salvage": salvage} for i in b]}
        p = subprocess.Popen(
            [sys.executable, "-m", "kinetoscope.trace._worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        assert p.stdin is not None
        p.stdin.write(orjson.dumps(job))
        p.stdin.close()
        procs.append((p, b))
    errors: dict[int, TraceError] = {}
    for p, b in procs:
        assert p.stdout is not None
        for line in p.stdout:
            try:
                res = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            err = res.get("error")
            if err is not None:
                errors[b[res["i"]]] = TraceError(
                    err["path"],
                    err["problem"],
                    offset=err["offset"],
                    event_index=err["event_index"],
                    field=err["field"],
                )
        p.wait()
    return errors
