"""The reduce step: per-rank results -> the ``kscope analyze --json`` document, on the driver.

Per analysis, by its ``AnalysisSpec.combine`` (see docs/scale.md):

* ``concat``: the per-rank frames concatenated in input order (what the analysis itself does
  over a list of traces); ``concat_by_rank``: in rank order (nulls last), for analyses that
  sort their output by rank first;
* ``reduce``: a ``Reducer`` below: ``map(trace, options)`` on the worker returns a small
  partial, ``reduce(partials, options)`` on the driver the frame;
* ``driver``: the analysis on the full traces sent back by the workers.

Then the job diagnosis (``run_diagnosis``) on the rank digests (``diagnosis.extract``) and ``build_document``, the same
functions the single-process path uses, so the two documents are equal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from kinetoscope.analysis.registry import AnalysisSpec
from kinetoscope.analysis.runner import (
    AnalysisFailure,
    AnalysisResults,
    build_document,
    collect_results,
)
from kinetoscope.errors import UsageError
from kinetoscope.scale.mapper import RankResult
from kinetoscope.scale.reducers import REDUCERS
from kinetoscope.scale.request import AnalyzeRequest
from kinetoscope.trace import TraceList, check_ranks


def _by_rank(ranks: Sequence[RankResult]) -> list[RankResult]:
    """Stable rank order, unknown ranks last (as ``sort("rank", nulls_last=True)``)."""
    return sorted(
        ranks,
        key=lambda r: (
            r.meta is None or r.meta.rank is None,
            r.meta.rank if r.meta and r.meta.rank is not None else 0,
        ),
    )


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    rows = [f for f in frames if f.height]
    if not rows:
        return frames[0] if frames else pl.DataFrame()
    try:
        return pl.concat(rows, how="vertical")
    except pl.exceptions.SchemaError:  # a rank typed a column differently (e.g. all-null)
        return pl.concat(rows, how="vertical_relaxed")


def combine_results(
    ranks: Sequence[RankResult], names: Sequence[str] | None, options: Mapping[str, Any] | None
) -> AnalysisResults:
    """Per-rank results (loaded ranks, input order) -> the results ``run_analyses`` would give."""
    traces = [r.trace for r in ranks if r.trace is not None]

    def compute(spec: AnalysisSpec) -> pl.DataFrame:
        failed = next((r.errors[spec.name] for r in ranks if spec.name in r.errors), None)
        if failed is not None:
            raise AnalysisFailure(failed)
        if spec.combine in ("concat", "concat_by_rank"):
            order = _by_rank(ranks) if spec.combine == "concat_by_rank" else ranks
            return _concat([r.results[spec.name] for r in order])
        if spec.combine == "reduce":
            return REDUCERS[spec.name].reduce(
                [r.partials[spec.name] for r in ranks], spec.resolve_options(options)
            )
        return spec.call(traces, options)

    return collect_results(names, any(r.has_gpu for r in ranks), compute)


@dataclass
class ScaleRun:
    document: dict[str, Any]
    results: AnalysisResults
    traces: TraceList  # trimmed traces (metadata is complete), in input order
    load_errors: dict[str, str]  # file -> why it could not be loaded
    backend: str = "single"  # where the map ran
    why: str = ""  # why that backend (``--backend auto`` says it)
    notes: list[str] = field(default_factory=list)
    workers: dict[str, str] = field(default_factory=dict)  # file -> where its map task ran (host:pid[@node])


def _wanted(ok: list[RankResult], ranks: frozenset[int] | None) -> list[RankResult]:
    """The loaded ranks ``--ranks`` asks for; none of them is a usage error naming the loaded ones."""
    if ranks is None:
        return ok
    kept = [r for r in ok if r.meta is not None and r.meta.rank in ranks]
    if not kept:
        have = sorted({r.meta.rank for r in ok if r.meta is not None and r.meta.rank is not None})
        want = ",".join(map(str, sorted(ranks)))
        raise UsageError(
            f"--ranks {want}: no trace has those ranks (loaded ranks: {', '.join(map(str, have)) or 'none known'})"
        )
    return kept


def reduce_document(ranks: Sequence[RankResult], request: AnalyzeRequest, names: Sequence[str]) -> ScaleRun:
    """The document from the per-rank results (any order; put back in input order).

    A file that failed to load is an entry of ``errors`` keyed by its path (the analyses of the
    other ranks are complete). ``request.ranks`` keeps only those ranks, as ``--ranks`` does."""
    ordered = sorted(ranks, key=lambda r: r.index)
    load_errors = {r.path: r.error for r in ordered if r.error is not None}
    ok = _wanted([r for r in ordered if r.error is None], request.ranks)
    traces = TraceList([r.trace for r in ok], None)
    traces.problems = check_ranks(traces)
    results = combine_results(ok, names, request.options) if request.analyses else AnalysisResults()
    errors = {**load_errors, **results.errors}
    results.errors.clear()
    results.errors.update(errors)
    diag: dict[str, Any] = {}
    if request.diagnosis and traces:
        # imported here: a run without the diagnosis (--only analyses) skips its ~20 modules
        from kinetoscope.diagnosis.document import run_diagnosis

        diag = run_diagnosis(traces, results, **request.diagnosis_options())
        if request.only_diagnosis:
            diag = {k: v for k, v in diag.items() if k in request.only_diagnosis or k == "summary"}
    run = ScaleRun(build_document(traces, results, diagnosis=diag), results, traces, load_errors)
    run.workers = {r.path: r.worker for r in ordered}
    return run
