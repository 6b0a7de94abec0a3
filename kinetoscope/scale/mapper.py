"""The map step: one rank file on one worker -> small per-rank results.

A worker loads its file (parse, or the Parquet cache keyed by content hash), runs the analyses
that split over ranks on that one trace and returns only small things: result DataFrames,
partials for the cross-rank reducers, and a digest of the trace for the driver (its metadata and
what the job diagnosis reads of it: ``kinetoscope.diagnosis.extract``). A file that fails to load comes back as an error naming it,
so the other ranks are still analysed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from kinetoscope.scale.request import AnalyzeRequest
from kinetoscope.trace.model import Trace, TraceMeta


@dataclass(frozen=True)
class RankTask:
    """What one worker needs: picklable, no open handles."""

    index: int  # position in the input order (results are put back in this order)
    path: str
    names: tuple[str, ...]  # the analyses to run (the plan's, resolved)
    request: AnalyzeRequest
    load_workers: int | None = None  # chunk workers for a large file (0: none; pools pass 0)
    project: bool = True  # load only what the analyses read (``task_reads``); False: everything


@dataclass
class RankResult:
    index: int
    path: str
    error: str | None = None  # the file could not be loaded, or its task failed (message names it)
    trace: Trace | None = None  # a DigestTrace (metadata + diagnosis figures), or full for "driver" analyses
    has_gpu: bool = False
    results: dict[str, pl.DataFrame] = field(default_factory=dict)  # "concat" analyses
    errors: dict[str, str] = field(default_factory=dict)  # analysis name -> message
    partials: dict[str, Any] = field(default_factory=dict)  # "reduce" analyses
    worker: str = ""  # where it ran: host:pid, plus the Ray node id on Ray

    @property
    def meta(self) -> TraceMeta | None:
        return self.trace.meta if self.trace is not None else None


def preload(names: tuple[str, ...], diagnosis: bool) -> list[str]:
    """The modules a map task imports to run ``names`` (and the diagnosis's figures): what a
    local pool's fork server imports once for all its workers (``scale.stealing``)."""
    from kinetoscope.analysis import registry

    mods = ["kinetoscope.scale.mapper", "kinetoscope.trace", "kinetoscope.scale.memory"]
    mods += ["kinetoscope.scale.reducers", "kinetoscope.analysis._common", "kinetoscope.trace.compact"]
    mods += [registry.func_target(registry.get(n).func).partition(":")[0] for n in names]
    if diagnosis:
        mods.append("kinetoscope.diagnosis.extract")
    return list(dict.fromkeys(mods))


def _where() -> str:
    """``host:pid`` of this worker, with ``@<ray node id>`` inside a Ray task."""
    import socket
    import sys

    here = f"{socket.gethostname()}:{os.getpid()}"
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        here += f"@{ray.get_runtime_context().get_node_id()}"
    return here


def _load_error(path: str, exc: Exception) -> str:
    return str(exc) if exc.__class__.__name__ == "TraceError" else f"{path}: {type(exc).__name__}: {exc}"


def map_rank(task: RankTask) -> RankResult:
    """Load one rank file and analyse it (see module docstring). Never raises for a bad file."""
    from kinetoscope.scale.memory import check_fits
    from kinetoscope.trace import load_trace

    req = task.request
    out = RankResult(task.index, task.path, worker=_where())
    try:
        columns = task_reads(task)
        # before loading: a clear error, never an OOM kill
        out.error = check_fits(task.path, whole=columns is None or not _core_only(task.names))
        if out.error is not None:
            return out
        trace = load_trace(
            task.path,
            cache=req.cache,
            salvage=req.salvage,
            cache_dir=req.cache_dir,
            workers=task.load_workers,
            columns=columns,
        )
    except Exception as exc:  # noqa: BLE001 - one bad rank file must not stop the other ranks
        out.error = _load_error(task.path, exc)
        return out
    full = _analyse(trace, task, out)
    if not full:
        _release(trace)  # the analyses' shared intermediates, before the diagnosis makes its own
    out.trace = trace if full else _for_driver(trace, req.diagnosis)
    return out


def _core_only(names: tuple[str, ...]) -> bool:
    """Whether every analysis reads only ``CORE_READS``: the set ``LOAD_FACTOR`` was measured
    with. A heavier one (call graph, critical path, ...) builds structures of its own, measured
    only within the every-analysis, whole-trace figure, so its memory check keeps that factor."""
    from kinetoscope.analysis import registry
    from kinetoscope.analysis.reads import CORE_READS

    return all(registry.get(n).reads == CORE_READS for n in names)


def _release(trace: Trace) -> None:
    from kinetoscope.analysis._common import forget_memos
    from kinetoscope.trace.compact import release_free_memory

    forget_memos(trace)
    release_free_memory()


def task_reads(task: RankTask) -> dict[str, set[str]] | None:
    """What the task's analyses and the diagnosis read of the trace (``AnalysisSpec.reads``,
    ``diagnosis.extract.READS``): only that is loaded, so a huge trace's unread columns and
    tables never take memory. None (load everything) when an analysis does not declare it or
    is a ``driver`` analysis (the whole trace goes to the driver), or ``task.project`` is off."""
    from kinetoscope.analysis import registry
    from kinetoscope.analysis.reads import DEVICE_COLUMNS

    if not task.project:
        return None
    if any(registry.get(name).combine == "driver" for name in task.names):
        return None
    reads = registry.reads_of(task.names)
    if reads is None:
        return None
    # the map's own GPU check (``_analyse``: ``device_frame``), whatever the analyses read
    reads.setdefault("events", set()).update(DEVICE_COLUMNS)
    if task.request.diagnosis:  # the diagnosis is imported only when it runs
        from kinetoscope.diagnosis.extract import READS

        for table, cols in READS.items():
            reads.setdefault(table, set()).update(cols)
    return reads


def _analyse(trace: Trace, task: RankTask, out: RankResult) -> bool:
    """Run the per-rank analyses into ``out``; True when a ``driver`` analysis needs the full trace."""
    from kinetoscope.analysis import registry
    from kinetoscope.analysis._common import device_frame
    from kinetoscope.scale.reducers import REDUCERS

    out.has_gpu = device_frame(trace).height > 0
    opts = task.request.options
    full = False
    for name in task.names:
        spec = registry.get(name)
        try:
            if spec.combine in ("concat", "concat_by_rank"):
                out.results[name] = spec.call([trace], opts)
            elif spec.combine == "reduce":
                out.partials[name] = REDUCERS[name].map(trace, spec.resolve_options(opts))
            else:
                full = True
        except Exception as exc:  # noqa: BLE001 - recorded per analysis, as run_analyses does
            out.errors[name] = f"{type(exc).__name__}: {exc}"
    return full


def _for_driver(trace: Trace, diagnosis: bool) -> Trace:
    """The diagnosis's figures of the rank (``diagnosis.extract``: O(steps + collectives), not
    O(events)), or only the metadata when no diagnosis is wanted."""
    if not diagnosis:  # no import of the diagnosis (~20 modules) for a run that wants none
        return Trace(meta=trace.meta)
    from kinetoscope.diagnosis.extract import digest_trace

    return digest_trace(trace)
