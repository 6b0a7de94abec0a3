"""Kernel duration distribution across ranks, for the top kernels.

Definition: the *top kernels* are the names that ``kernel_breakdown`` lists on any rank (its
``num_kernels`` / ``duration_ratio`` folding; ``others`` excluded). For each top kernel and each
rank on which it runs, the distribution of its individual call durations (µs): ``count``,
``sum``, ``mean``, ``min``, ``max``, ``stddev`` (sample std, 0 for one call) and the 50th, 90th
and 99th percentiles (linear interpolation). Comparing a kernel's row across ranks shows the
rank whose calls are slower (a straggler) or more variable.

HTA only draws this as per-kernel bar charts of ``mean`` with min/max error bars by rank (from
its kernel breakdown, whose min/max/mean are wrong in the folding branch, see
kernel_breakdown); this returns the numbers.
"""

from __future__ import annotations

import polars as pl

from kinetoscope.analysis._common import CORE_READS, TraceInput, as_traces, device_frame, per_rank, rank_lit
from kinetoscope.analysis.kernel_breakdown import OTHERS, analysed_types, kernel_breakdown
from kinetoscope.analysis.registry import AnalysisSpec, register
from kinetoscope.trace.model import Trace

DISTRIBUTION_SCHEMA: dict[str, pl.DataType] = {
    "kernel_type": pl.String(),
    "name": pl.String(),
    "rank": pl.Int64(),
    "count": pl.Int64(),
    "sum (us)": pl.Float64(),
    "mean (us)": pl.Float64(),
    "min (us)": pl.Float64(),
    "max (us)": pl.Float64(),
    "stddev": pl.Float64(),
    "p50 (us)": pl.Float64(),
    "p90 (us)": pl.Float64(),
    "p99 (us)": pl.Float64(),
}


def kernel_distribution(
    traces: TraceInput,
    num_kernels: int = 10,
    duration_ratio: float = 0.8,
    include_memory_kernels: bool = True,
) -> pl.DataFrame:
    """One row per (top kernel, rank); see module docstring."""
    tl = as_traces(traces)
    top = (
        kernel_breakdown(tl, num_kernels, duration_ratio, include_memory_kernels)
        .filter(pl.col("name") != OTHERS)
        .select("kernel_type", "name")
        .unique()
    )
    if top.is_empty():
        return pl.DataFrame(schema=DISTRIBUTION_SCHEMA)
    types = analysed_types(include_memory_kernels)

    def one_rank(t: Trace) -> pl.DataFrame | None:
        dev = device_frame(t).filter(pl.col("kernel_type").is_in(types))
        dev = dev.join(top, on=["kernel_type", "name"], how="semi")
        if dev.is_empty():
            return None
        d = pl.col("dur").cast(pl.Float64) / 1000.0
        return (
            dev.group_by("kernel_type", "name")
            .agg(
                pl.len().cast(pl.Int64).alias("count"),
                d.sum().alias("sum (us)"),
                d.mean().alias("mean (us)"),
                d.min().alias("min (us)"),
                d.max().alias("max (us)"),
                d.std().fill_null(0.0).fill_nan(0.0).alias("stddev"),
                d.quantile(0.5, "linear").alias("p50 (us)"),
                d.quantile(0.9, "linear").alias("p90 (us)"),
                d.quantile(0.99, "linear").alias("p99 (us)"),
            )
            .with_columns(rank_lit(t))
        )

    out = per_rank(tl, one_rank, DISTRIBUTION_SCHEMA)
    # Order: kernels by their total across ranks, then rank.
    total = pl.col("sum (us)").sum().over("kernel_type", "name")
    return out.sort(
        [pl.col("kernel_type"), total, pl.col("name"), pl.col("rank")],
        descending=[False, True, False, False],
        nulls_last=True,
    )


register(
    AnalysisSpec(
        name="kernel_distribution",
        func=kernel_distribution,
        combine="reduce",
        reads=CORE_READS,
        description="Per top kernel and rank: call count and duration distribution (mean, min, max, std, p50/p90/p99).",
        options={"num_kernels": 10, "duration_ratio": 0.8, "include_memory_kernels": True},
        order=32,
    )
)
