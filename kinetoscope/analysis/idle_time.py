"""Idle-time breakdown: why each GPU stream sits idle (host wait, kernel wait, other).

Definition (HTA §1.6, ``BreakdownAnalysis.get_idle_time_breakdown``), per rank and stream, over
device events (kernels, memcpy, memset, MTIA device events; ``cuda_sync`` rows excluded as in
HTA) sorted by start:

* the *frontier* before an event is the latest end among the earlier events of the stream;
* its idle gap is ``ts − frontier`` (the first event of a stream has no gap);
* **host_wait** if the runtime call that launched it (same ``correlation``) started after the
  frontier: the CPU issued it after the stream had drained;
* else **kernel_wait** if the gap is below ``consecutive_kernel_delay_us`` (default 30 µs):
  the normal back-to-back launch overhead;
* else **other** (e.g. waiting on another stream or on a synchronisation).

``idle_time`` is the sum of the gaps per category (µs); ``idle_time_ratio`` is that over the
stream's total idle time (null when the stream never idles). Every stream gets all three
categories (0 when absent).

Deliberate differences from HTA (docs/analysis.md): the threshold is in **µs** and documented
as such (HTA's docstring says ns, its code uses µs); the frontier is the running maximum of
earlier ends, not just the previous event's end, and a negative gap (an event overlapping
earlier work on the same stream) is not idle time: HTA adds such negative gaps to kernel_wait,
which can make it negative. Times are exact ns (no µs rounding).

``idle_time_interval_stats`` gives ``describe()`` of the gaps per rank, stream and category.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from kinetoscope.analysis._common import (
    CORE_READS,
    TraceInput,
    describe_aggs,
    describe_schema,
    device_frame,
    launch_times,
    per_rank,
    rank_lit,
)
from kinetoscope.analysis.intervals import ENGINE
from kinetoscope.analysis.registry import AnalysisSpec, register
from kinetoscope.trace.model import Trace

HOST_WAIT = "host_wait"
KERNEL_WAIT = "kernel_wait"
OTHER = "other"
IDLE_CATEGORIES = (HOST_WAIT, KERNEL_WAIT, OTHER)
DEFAULT_CONSECUTIVE_KERNEL_DELAY_US = 30.0

IDLE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "stream": pl.Int64(),
    "idle_category": pl.String(),
    "idle_time": pl.Float64(),
    "idle_time_ratio": pl.Float64(),
}
INTERVAL_STATS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "stream": pl.Int64(),
    "idle_category": pl.String(),
    **describe_schema(),
}


def idle_intervals(
    trace: Trace,
    consecutive_kernel_delay_us: float = DEFAULT_CONSECUTIVE_KERNEL_DELAY_US,
    streams: Sequence[int] | None = None,
) -> pl.DataFrame:
    """Every idle gap of one trace: ``stream, idx, ts, gap`` (ns), ``launch_ts`` (ns, null when
    the launch is not in the trace) and ``idle_category``; one row per device event that
    follows earlier work on its stream without overlapping it."""
    dev = device_frame(trace)
    if streams:
        dev = dev.filter(pl.col("stream").is_in(list(streams)))
    launches = launch_times(trace)
    threshold_ns = consecutive_kernel_delay_us * 1000.0
    return (
        dev.lazy()
        .select("stream", "idx", "ts", "end", "correlation")
        .join(launches.lazy(), on="correlation", how="left", maintain_order="left")
        .sort("ts", "end", "idx")  # the window below keeps each stream's rows in this order
        .with_columns(frontier=pl.col("end").cum_max().shift(1).over("stream"))
        .with_columns(gap=pl.col("ts") - pl.col("frontier"))
        .filter(pl.col("gap").is_not_null() & (pl.col("gap") >= 0))
        .with_columns(
            idle_category=pl.when(pl.col("launch_ts") > pl.col("frontier"))
            .then(pl.lit(HOST_WAIT))
            .when(pl.col("gap") < threshold_ns)
            .then(pl.lit(KERNEL_WAIT))
            .otherwise(pl.lit(OTHER))
        )
        .select("stream", "idx", "ts", "gap", "launch_ts", "idle_category")
        .collect(engine=ENGINE)
    )


def idle_time_breakdown(
    traces: TraceInput,
    consecutive_kernel_delay_us: float = DEFAULT_CONSECUTIVE_KERNEL_DELAY_US,
    streams: Sequence[int] | None = None,
) -> pl.DataFrame:
    """``rank, stream, idle_category, idle_time (µs), idle_time_ratio`` for every stream."""
    cats = pl.DataFrame({"idle_category": list(IDLE_CATEGORIES)})

    def one_rank(t: Trace) -> pl.DataFrame | None:
        dev_streams = device_frame(t).select("stream").unique()
        if streams:
            dev_streams = dev_streams.filter(pl.col("stream").is_in(list(streams)))
        if dev_streams.is_empty():
            return None
        gaps = idle_intervals(t, consecutive_kernel_delay_us, streams)
        sums = gaps.group_by("stream", "idle_category").agg(pl.col("gap").sum().alias("idle"))
        full = (
            dev_streams.join(cats, how="cross")
            .join(sums, on=["stream", "idle_category"], how="left")
            .with_columns(pl.col("idle").fill_null(0))
            .with_columns(total=pl.col("idle").sum().over("stream"))
            .select(
                rank_lit(t),
                "stream",
                "idle_category",
                (pl.col("idle") / 1000.0).alias("idle_time"),
                pl.when(pl.col("total") > 0)
                .then(pl.col("idle") / pl.col("total"))
                .otherwise(None)
                .alias("idle_time_ratio"),
            )
        )
        return full

    order = pl.col("idle_category").replace_strict({c: i for i, c in enumerate(IDLE_CATEGORIES)})
    out = per_rank(traces, one_rank, IDLE_SCHEMA)
    return out.sort([pl.col("rank"), pl.col("stream"), order], nulls_last=True)


def idle_time_interval_stats(
    traces: TraceInput,
    consecutive_kernel_delay_us: float = DEFAULT_CONSECUTIVE_KERNEL_DELAY_US,
    streams: Sequence[int] | None = None,
) -> pl.DataFrame:
    """``describe()`` of the idle gaps (µs) per ``rank, stream, idle_category``
    (HTA's ``show_idle_interval_stats`` output)."""

    def one_rank(t: Trace) -> pl.DataFrame | None:
        gaps = idle_intervals(t, consecutive_kernel_delay_us, streams)
        if gaps.is_empty():
            return None
        stats = (
            gaps.with_columns(gap_us=pl.col("gap") / 1000.0)
            .group_by("stream", "idle_category")
            .agg(describe_aggs("gap_us"))
            .with_columns(rank_lit(t))
        )
        return stats

    order = pl.col("idle_category").replace_strict({c: i for i, c in enumerate(IDLE_CATEGORIES)})
    out = per_rank(traces, one_rank, INTERVAL_STATS_SCHEMA)
    return out.sort([pl.col("rank"), pl.col("stream"), order], nulls_last=True)


_OPTS = {"consecutive_kernel_delay_us": DEFAULT_CONSECUTIVE_KERNEL_DELAY_US, "streams": None}
register(
    AnalysisSpec(
        name="idle_time_breakdown",
        func=idle_time_breakdown,
        combine="concat_by_rank",
        reads=CORE_READS,
        description="GPU idle time per rank and stream: host wait, kernel wait (< 30 µs gaps), other.",
        options=_OPTS,
        order=20,
    )
)
register(
    AnalysisSpec(
        name="idle_time_interval_stats",
        func=idle_time_interval_stats,
        combine="concat_by_rank",
        reads=CORE_READS,
        description="Statistics of the idle gaps per rank, stream and idle category.",
        options=_OPTS,
        default=False,
        order=21,
    )
)
