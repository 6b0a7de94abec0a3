"""Temporal breakdown: how a rank's GPU time splits into idle, compute and non-compute.

Definition (HTA §1.5, ``BreakdownAnalysis.get_temporal_breakdown``), per rank:

* device events = kernels, memcpy, memset and MTIA device events that carry a stream;
* ``kernel_time`` = end of the last device event − start of the first one;
* ``busy`` = length of the union of all device-event intervals (all streams);
* ``idle_time = kernel_time − busy``;
* ``compute_time`` = length of the union of COMPUTATION kernels (``kernel_types``);
* ``non_compute_time = kernel_time − compute_time − idle_time`` = busy time during which no
  compute kernel runs (communication, memory and OTHER kernels not hidden under compute);
* each ``*_pctg = round(100 * x / kernel_time, 2)``.

Times are integer ns internally and reported in µs. Differences from HTA (docs/analysis.md):
``cuda_sync`` rows (Stream/Context/Event Sync on the device timeline) are not device work and
are left out, HTA counts them as busy, OTHER time; no µs rounding of ns traces; kernels launched
in the last ProfilerStep, or whose launch is outside the trace, are kept.

``temporal_breakdown_by_step`` is the same per step, with device events assigned to the step
that launched them (``steps.assign_steps``).
"""

from __future__ import annotations

import polars as pl

from kinetoscope.analysis._common import CORE_READS, TraceInput, device_frame, per_rank, rank_lit
from kinetoscope.analysis.intervals import busy_span
from kinetoscope.analysis.kernel_types import COMPUTATION
from kinetoscope.analysis.registry import AnalysisSpec, register
from kinetoscope.analysis.steps import assign_steps
from kinetoscope.trace.model import Trace

TEMPORAL_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "idle_time(us)": pl.Float64(),
    "compute_time(us)": pl.Float64(),
    "non_compute_time(us)": pl.Float64(),
    "kernel_time(us)": pl.Float64(),
    "idle_time_pctg": pl.Float64(),
    "compute_time_pctg": pl.Float64(),
    "non_compute_time_pctg": pl.Float64(),
}
TEMPORAL_BY_STEP_SCHEMA: dict[str, pl.DataType] = {"rank": pl.Int64(), "step": pl.Int64()} | {
    k: v for k, v in TEMPORAL_SCHEMA.items() if k != "rank"
}


def _breakdown(dev: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Temporal numbers (ns) per group of ``keys`` over device events with ``kernel_type``."""
    allk = busy_span(dev, keys)
    comp = busy_span(dev.filter(pl.col("kernel_type") == COMPUTATION), keys).select(
        [*keys, pl.col("busy").alias("compute")]
    )
    if keys:
        out = allk.join(comp, on=keys, how="left", nulls_equal=True)
    else:
        out = allk.with_columns(compute=comp["compute"] if comp.height else pl.lit(0, dtype=pl.Int64))
    out = out.with_columns(pl.col("compute").fill_null(0), kernel_time=pl.col("last") - pl.col("first"))
    out = out.with_columns(idle=pl.col("kernel_time") - pl.col("busy"))
    out = out.with_columns(non_compute=pl.col("kernel_time") - pl.col("compute") - pl.col("idle"))

    def pct(c: str) -> pl.Expr:
        return (
            pl.when(pl.col("kernel_time") > 0)
            .then((100.0 * pl.col(c) / pl.col("kernel_time")).round(2))
            .otherwise(None)
        )

    return out.select(
        *keys,
        (pl.col("idle") / 1000.0).alias("idle_time(us)"),
        (pl.col("compute") / 1000.0).alias("compute_time(us)"),
        (pl.col("non_compute") / 1000.0).alias("non_compute_time(us)"),
        (pl.col("kernel_time") / 1000.0).alias("kernel_time(us)"),
        pct("idle").alias("idle_time_pctg"),
        pct("compute").alias("compute_time_pctg"),
        pct("non_compute").alias("non_compute_time_pctg"),
    )


def temporal_breakdown(traces: TraceInput) -> pl.DataFrame:
    """One row per rank with device events (HTA's columns; times in µs). Ranks without any
    device event are left out."""

    def one_rank(t: Trace) -> pl.DataFrame | None:
        dev = device_frame(t)
        if dev.is_empty():
            return None
        return _breakdown(dev, []).with_columns(rank_lit(t))

    return per_rank(traces, one_rank, TEMPORAL_SCHEMA)


def temporal_breakdown_by_step(traces: TraceInput, steps: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per rank and step (``step`` column), device events assigned to the step that
    launched them. Ranks without steps are left out; device events outside every step are
    ignored here."""

    def one_rank(t: Trace) -> pl.DataFrame | None:
        dev = device_frame(t)
        if dev.is_empty():
            return None
        dev = assign_steps(t, dev, steps).filter(pl.col("step").is_not_null())
        if dev.is_empty():
            return None
        return _breakdown(dev, ["step"]).with_columns(rank_lit(t))

    return per_rank(traces, one_rank, TEMPORAL_BY_STEP_SCHEMA).sort("rank", "step", nulls_last=True)


register(
    AnalysisSpec(
        name="temporal_breakdown",
        func=temporal_breakdown,
        combine="concat",
        reads=CORE_READS,
        description="GPU time per rank split into idle, compute and non-compute (HTA temporal breakdown).",
        order=10,
    )
)
register(
    AnalysisSpec(
        name="temporal_breakdown_by_step",
        func=temporal_breakdown_by_step,
        combine="concat_by_rank",
        reads=CORE_READS,
        description="Temporal breakdown per training step (kernels assigned to the step that launched them).",
        order=11,
        group="steps",
        empty_note="no steps found (no ProfilerStep#N or Optimizer.step annotations)",
    )
)
