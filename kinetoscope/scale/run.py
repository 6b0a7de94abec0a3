"""The one orchestration of an analysis: files -> map per rank -> reduce -> document.

``kscope analyze`` (every backend), ``kscope report``, the web app and the demo all end here
(through ``kinetoscope.orchestration.analyze``), so a single process and a map/reduce over a cluster
build the document with the same code. Steps:

1. ``make_plan``: which analyses run per rank, which are reduced across ranks;
2. ``choose_backend``: where the map runs (``--backend auto`` says which and why; on Ray, the
   executor adds which nodes the tasks go to);
3. the map (``mapper.map_rank``, one task per rank file), streamed: each rank's small result is
   kept as it arrives and ``progress`` is told; a failed rank is an ``errors`` entry;
4. the reduce (``reduce.reduce_document``): cross-rank results, the job diagnosis, the document.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

from kinetoscope.scale.executors import Executor, Outcome, choose_backend, make_executor
from kinetoscope.scale.mapper import RankResult, RankTask, map_rank, preload
from kinetoscope.scale.plan import Plan, make_plan
from kinetoscope.scale.reduce import ScaleRun, reduce_document
from kinetoscope.scale.request import AnalyzeRequest
from kinetoscope.trace.discover import InputError, expand_paths

# progress(done, failed, total) after each rank
Progress = Callable[[int, int, int], None]


def _tasks(files: Sequence[str], plan: Plan, request: AnalyzeRequest, backend: str) -> list[RankTask]:
    # in this process a large file may use chunk workers; in a pool each worker parses one file
    load_workers = None if backend == "single" else 0
    return [RankTask(i, f, tuple(plan.names), request, load_workers) for i, f in enumerate(files)]


def _result(out: Outcome[RankTask, RankResult], backend: str) -> RankResult:
    if out.value is None:
        return RankResult(out.item.index, out.item.path, error=f"{out.item.path}: {out.error}")
    if backend == "single":
        # Detach the small results from the rank's full tables (a Polars filter or slice may
        # share their buffers), as a pool's pickling does: the driver keeps only small things.
        return cast(RankResult, pickle.loads(pickle.dumps(out.value, protocol=pickle.HIGHEST_PROTOCOL)))
    return out.value


def run_analysis(
    request: AnalyzeRequest,
    files: Sequence[str | os.PathLike[str]] | None = None,
    *,
    progress: Progress | None = None,
    on_backend: Callable[[str, str, int], None] | None = None,
) -> ScaleRun:
    """Analyse ``files`` (default: ``request.inputs``, folders expanded) as the request says.

    ``on_backend(backend, why, n_files)`` is told the backend chosen before any work starts. Raises
    ``InputError`` when there is no file or no file could be analysed (each file's error in
    the message)."""
    paths = expand_paths([os.fspath(p) for p in (request.inputs if files is None else files)])
    if not paths:
        raise InputError("no trace files to analyse")
    plan = make_plan(request.names or None) if request.analyses else Plan()
    backend, why = choose_backend(
        request.backend,
        len(paths),
        workers=request.workers,
        ray_address=request.ray_address,
        json_bytes=_json_total(paths) if request.backend == "auto" else None,
    )
    executor = make_executor(
        backend,
        workers=request.workers,
        ray_address=request.ray_address,
        steal=True,  # map_rank never raises and checks memory first: the driver may run a rank
        preload=preload(tuple(plan.names), request.diagnosis),
    )
    try:
        where = executor.describe(len(paths))  # Ray: which nodes the tasks go to
        why = f"{why}; {where}" if where else why
        if on_backend is not None:
            on_backend(backend, why, len(paths))
        ranks = _map(executor, _tasks(paths, plan, request, backend), backend, progress)
    finally:
        executor.close()
    if all(r.error is not None for r in ranks):
        raise InputError("no trace file could be loaded: " + "; ".join(str(r.error) for r in ranks[:5]))
    run = reduce_document(ranks, request, plan.names)
    run.backend, run.why = backend, why
    run.notes.extend(executor.notes)
    return run


def _json_total(paths: Sequence[str]) -> int | None:
    """The JSON bytes of all the files (gzip: from each trailer), or None when one cannot be read
    (the backend is then chosen by the number of files only)."""
    from kinetoscope.scale.memory import json_bytes

    try:
        return sum(json_bytes(p) for p in paths)
    except OSError:
        return None


def _map(
    executor: Executor, tasks: list[RankTask], backend: str, progress: Progress | None
) -> list[RankResult]:
    ranks: list[RankResult] = []
    failed = 0
    for out in executor.map_unordered(map_rank, tasks):
        res = _result(out, backend)
        failed += res.error is not None
        ranks.append(res)
        if progress is not None:
            progress(len(ranks), failed, len(tasks))
    return ranks


def file_list(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """``paths`` with folders expanded (for callers that show the count before running)."""
    return [Path(p) for p in expand_paths([os.fspath(p) for p in paths])]
