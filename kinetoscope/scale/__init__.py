"""Scale-out analysis: thousands of rank traces as a map/reduce, on a process pool or on Ray.

    from kinetoscope.scale import analyze_files
    run = analyze_files(paths, backend="local", workers=8)    # or backend="ray"
    run.document    # equal to kinetoscope.pipeline.analyze_paths(paths) (tests/scale)

map (``mapper.map_rank``, one task per rank file, on a worker): load, run the per-rank analyses,
return small results. reduce (``reduce.reduce_document``, driver): concatenate / reduce across
ranks, diagnose the job, build the document. ``plan`` checks the split before any work starts;
``executors`` runs the tasks. See docs/scale.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kinetoscope.scale.executors import BACKENDS, make_executor
from kinetoscope.scale.mapper import RankResult, RankTask, map_rank
from kinetoscope.scale.plan import Plan, make_plan
from kinetoscope.scale.reduce import REDUCERS, ScaleRun, reduce_document

__all__ = ["BACKENDS", "REDUCERS", "Plan", "RankResult", "RankTask", "ScaleRun", "analyze_files", "make_plan", "map_rank"]


def analyze_files(
    paths: Sequence[str | os.PathLike[str]],
    *,
    backend: str = "local",
    workers: int | None = None,
    ray_address: str | None = None,
    names: Sequence[str] | None = None,
    options: Mapping[str, Any] | None = None,
    analyses: bool = True,
    diagnosis: bool = True,
    diagnosis_options: Mapping[str, Any] | None = None,
    only_diagnosis: Sequence[str] | None = None,
    wanted_ranks: set[int] | None = None,
    cache: bool = True,
    salvage: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ScaleRun:
    """Analyse trace files (folders expanded) as a map/reduce; the document as ``analyze_paths``.

    ``progress(done, total)`` is called after each rank is mapped. Raises ``InputError`` when
    no file could be loaded (each file's error is in the message)."""
    from kinetoscope.pipeline import InputError
    from kinetoscope.trace import expand_paths

    files = expand_paths([os.fspath(p) for p in paths])
    if not files:
        raise InputError("no trace files to analyse")
    plan = make_plan(names) if analyses else Plan()
    executor = make_executor(backend, workers=workers, ray_address=ray_address)
    in_process = backend == "local" and (workers == 1 or len(files) == 1)
    tasks = [
        RankTask(
            index=i, path=f, names=tuple(plan.names), options=dict(options or {}), diagnosis=diagnosis,
            cache=cache, salvage=salvage, cache_dir=os.fspath(cache_dir) if cache_dir is not None else None,
            load_workers=None if in_process else 0,
        )
        for i, f in enumerate(files)
    ]
    ranks: list[RankResult] = []
    try:
        for res in executor.map_unordered(map_rank, tasks):
            ranks.append(res)
            if progress is not None:
                progress(len(ranks), len(tasks))
    finally:
        executor.close()
    if all(r.error is not None for r in ranks):
        raise InputError("no trace file could be loaded: " + "; ".join(str(r.error) for r in ranks[:5]))
    return reduce_document(
        ranks, names=plan.names, options=options, analyses=analyses, diagnosis=diagnosis,
        diagnosis_options=diagnosis_options, only_diagnosis=only_diagnosis, wanted_ranks=wanted_ranks,
    )
