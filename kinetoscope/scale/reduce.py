"""The reduce step: per-rank results -> the ``kscope analyze --json`` document, on the driver.

Per analysis, by its ``AnalysisSpec.combine`` (see docs/scale.md):

* ``concat``: the per-rank frames concatenated in input order (what the analysis itself does
  over a list of traces); ``concat_by_rank``: in rank order (nulls last), for analyses that
  sort their output by rank first;
* ``reduce``: a ``Reducer`` below: ``map(trace, options)`` on the worker returns a small
  partial, ``reduce(partials, options)`` on the driver the frame;
* ``driver``: the analysis on the full traces sent back by the workers.

Then the job diagnosis (``run_diagnosis``) on the slim traces and ``build_document``, the same
functions the single-process path uses, so the two documents are equal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from kinetoscope.analysis.runner import (
    AnalysisFailure,
    AnalysisResults,
    build_document,
    collect_results,
)
from kinetoscope.diagnosis.document import run_diagnosis
from kinetoscope.scale.mapper import RankResult
from kinetoscope.trace import TraceList, check_ranks
from kinetoscope.trace.model import Trace


@dataclass(frozen=True)
class Reducer:
    """A cross-rank analysis split into a per-rank partial and a driver-side reduce."""

    map: Callable[[Trace, Mapping[str, Any]], Any]
    reduce: Callable[[list[Any], Mapping[str, Any]], pl.DataFrame]


# kernel_distribution: the top kernels are the union over ranks of each rank's kernel_breakdown
# names, so a rank's rows can depend on other ranks. Each worker sends its own top names and the
# statistics of *every* kernel it ran (one row per distinct kernel: small); the driver keeps the
# rows of the union and orders them as kernel_distribution does.
def _kernel_distribution_map(trace: Trace, opts: Mapping[str, Any]) -> tuple[pl.DataFrame, pl.DataFrame]:
    from kinetoscope.analysis.kernel_breakdown import OTHERS, kernel_breakdown
    from kinetoscope.analysis.kernel_distribution import kernel_distribution

    top = (
        kernel_breakdown([trace], **opts).filter(pl.col("name") != OTHERS).select("kernel_type", "name").unique()
    )
    # no folding (ratio 1.0 and no count limit): every kernel's distribution on this rank
    every = kernel_distribution([trace], 1 << 62, 1.0, opts["include_memory_kernels"])
    return top, every


def _kernel_distribution_reduce(parts: list[tuple[pl.DataFrame, pl.DataFrame]], opts: Mapping[str, Any]) -> pl.DataFrame:
    from kinetoscope.analysis._common import concat_or_empty
    from kinetoscope.analysis.kernel_distribution import DISTRIBUTION_SCHEMA

    keys = ["kernel_type", "name"]
    tops = [t for t, _ in parts if t.height]
    if not tops:
        return pl.DataFrame(schema=DISTRIBUTION_SCHEMA)
    top = pl.concat(tops).unique()
    out = concat_or_empty([every.join(top, on=keys, how="semi") for _, every in parts], DISTRIBUTION_SCHEMA)
    total = pl.col("sum (us)").sum().over(keys)
    return out.sort([pl.col("kernel_type"), total, pl.col("name"), pl.col("rank")],
                    descending=[False, True, False, False], nulls_last=True)


REDUCERS: dict[str, Reducer] = {
    "kernel_distribution": Reducer(_kernel_distribution_map, _kernel_distribution_reduce),
}


def _by_rank(ranks: Sequence[RankResult]) -> list[RankResult]:
    """Stable rank order, unknown ranks last (as ``sort("rank", nulls_last=True)``)."""
    return sorted(ranks, key=lambda r: (r.meta is None or r.meta.rank is None, r.meta.rank if r.meta and r.meta.rank is not None else 0))


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    rows = [f for f in frames if f.height]
    if not rows:
        return frames[0] if frames else pl.DataFrame()
    try:
        return pl.concat(rows, how="vertical")
    except pl.exceptions.SchemaError:  # a rank typed a column differently (e.g. all-null)
        return pl.concat(rows, how="vertical_relaxed")


def combine_results(ranks: Sequence[RankResult], names: Sequence[str] | None, options: Mapping[str, Any] | None) -> AnalysisResults:
    """Per-rank results (loaded ranks, input order) -> the results ``run_analyses`` would give."""
    traces = [r.trace for r in ranks if r.trace is not None]

    def compute(spec: Any) -> pl.DataFrame:
        failed = next((r.errors[spec.name] for r in ranks if spec.name in r.errors), None)
        if failed is not None:
            raise AnalysisFailure(failed)
        if spec.combine in ("concat", "concat_by_rank"):
            order = _by_rank(ranks) if spec.combine == "concat_by_rank" else ranks
            return _concat([r.results[spec.name] for r in order])
        if spec.combine == "reduce":
            return REDUCERS[spec.name].reduce([r.partials[spec.name] for r in ranks], spec.resolve_options(options))
        return spec.call(traces, options)

    return collect_results(names, any(r.has_gpu for r in ranks), compute)


@dataclass
class ScaleRun:
    document: dict[str, Any]
    results: AnalysisResults
    traces: TraceList  # trimmed traces (metadata is complete), in input order
    load_errors: dict[str, str]  # file -> why it could not be loaded


def reduce_document(
    ranks: Sequence[RankResult],
    *,
    names: Sequence[str] | None = None,
    options: Mapping[str, Any] | None = None,
    analyses: bool = True,
    diagnosis: bool = True,
    diagnosis_options: Mapping[str, Any] | None = None,
    only_diagnosis: Sequence[str] | None = None,
    wanted_ranks: set[int] | None = None,
) -> ScaleRun:
    """The document from the per-rank results (any order; put back in input order).

    A file that failed to load is an entry of ``errors`` keyed by its path (the analyses of the
    other ranks are complete). ``wanted_ranks`` keeps only those ranks, as ``--ranks`` does."""
    ordered = sorted(ranks, key=lambda r: r.index)
    load_errors = {r.path: r.error for r in ordered if r.error is not None}
    ok = [r for r in ordered if r.error is None]
    if wanted_ranks is not None:
        ok = [r for r in ok if r.meta is not None and r.meta.rank in wanted_ranks]
    traces = TraceList([r.trace for r in ok], None)
    traces.problems = check_ranks(traces)
    results = combine_results(ok, names, options) if analyses else AnalysisResults()
    errors = {**load_errors, **results.errors}
    results.errors.clear()
    results.errors.update(errors)
    diag: dict[str, Any] = {}
    if diagnosis and traces:
        diag = run_diagnosis(traces, results, **dict(diagnosis_options or {}))
        if only_diagnosis:
            diag = {k: v for k, v in diag.items() if k in only_diagnosis or k == "summary"}
    return ScaleRun(build_document(traces, results, diagnosis=diag), results, traces, load_errors)
