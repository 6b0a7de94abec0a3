"""The map step: one rank file on one worker -> small per-rank results.

A worker loads its file (parse, or the Parquet cache keyed by content hash), runs the analyses
that split over ranks on that one trace and returns only small things: result DataFrames,
partials for the cross-rank reducers, and a trimmed trace for the driver (metadata only, or what
the diagnosis reads: ``slim.py``). A file that fails to load comes back as an error naming it,
so the other ranks are still analysed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from kinetoscope.trace.model import Trace, TraceMeta


@dataclass(frozen=True)
class RankTask:
    """What one worker needs: picklable, no open handles."""

    index: int  # position in the input order (results are put back in this order)
    path: str
    names: tuple[str, ...]
    options: Mapping[str, Any] = field(default_factory=dict)
    diagnosis: bool = True  # send back what the diagnosis reads
    cache: bool = True
    salvage: bool = False
    cache_dir: str | None = None
    load_workers: int | None = None  # chunk workers for a large file (0: none; pools pass 0)


@dataclass
class RankResult:
    index: int
    path: str
    error: str | None = None  # the file could not be loaded (message names it)
    trace: Trace | None = None  # trimmed: metadata, + diagnosis rows, or full for "driver" analyses
    has_gpu: bool = False
    results: dict[str, pl.DataFrame] = field(default_factory=dict)  # "concat" analyses
    errors: dict[str, str] = field(default_factory=dict)  # analysis name -> message
    partials: dict[str, Any] = field(default_factory=dict)  # "reduce" analyses

    @property
    def meta(self) -> TraceMeta | None:
        return self.trace.meta if self.trace is not None else None


def map_rank(task: RankTask) -> RankResult:
    """Load one rank file and analyse it (see module docstring). Never raises for a bad file."""
    from kinetoscope.analysis import registry
    from kinetoscope.analysis._common import device_frame
    from kinetoscope.scale.reduce import REDUCERS
    from kinetoscope.scale.slim import meta_only, slim_for_diagnosis
    from kinetoscope.trace import load_trace

    out = RankResult(task.index, task.path)
    try:
        trace = load_trace(
            task.path, cache=task.cache, salvage=task.salvage, cache_dir=task.cache_dir, workers=task.load_workers
        )
    except Exception as exc:  # noqa: BLE001 - one bad rank file must not stop the other ranks
        out.error = str(exc) if exc.__class__.__name__ == "TraceError" else f"{task.path}: {type(exc).__name__}: {exc}"
        return out
    out.has_gpu = device_frame(trace).height > 0
    full = False
    for name in task.names:
        spec = registry.get(name)
        try:
            if spec.combine in ("concat", "concat_by_rank"):
                out.results[name] = spec.call([trace], task.options)
            elif spec.combine == "reduce":
                out.partials[name] = REDUCERS[name].map(trace, spec.resolve_options(task.options))
            else:
                full = True
        except Exception as exc:  # noqa: BLE001 - recorded per analysis, as run_analyses does
            out.errors[name] = f"{type(exc).__name__}: {exc}"
    out.trace = trace if full else slim_for_diagnosis(trace) if task.diagnosis else meta_only(trace)
    return out
