"""Counters over time: launch-queue length per stream, and memory-copy bandwidth.

Definitions (HTA §1.13, ``TraceCounters``):

Queue length (``queue_length_time_series``, ``queue_length_summary``)
    The number of operations launched on a stream but not yet started. Every host launch call
    (``kernel_types.LAUNCH_NAMES``) paired by ``correlation`` with its device event adds +1 at
    the launch call's start and −1 when the device event starts, on the device event's stream.
    The series has one row per change point (a step function: the value holds until the next
    row). The summary is ``describe()`` of the values at the change points per rank and stream
    (HTA's definition), plus ``time_weighted_mean`` (the average over time between the first
    and the last change point).

    Negative queue lengths (HTA issue, trace ``negative_queue_length_values_check``) come from
    device events counted without their launch, and from host/device clock skew putting a
    device start before its launch. Here only complete launch→device pairs count, a device
    start earlier than its launch is taken as the launch time (``skewed_starts`` counts
    them), and at equal times the +1 is applied before the −1. The queue length can therefore
    never be negative.

Time blocked on a full queue (``time_blocked_on_full_queue``)
    Per rank and stream, the time (µs) during which the queue length is
    ``>= max_queue_length`` (default 1024, CUDA's per-stream launch-queue depth), and that
    relative to the trace duration (last ``ts`` − first ``ts`` of all events, as HTA). Every
    stream is listed (0 when never full), with the largest queue length seen. HTA overwrites its
    result per stream and keeps only the last qualifying stream of each rank.

Memory bandwidth (``memory_bw_time_series``, ``memory_bw_summary``)
    MEMORY device events (memcpy/memset) are labelled by kind ("Memcpy HtoD", "Memcpy DtoH",
    "Memcpy DtoD", ... = the first 11 characters of a Memcpy name; "Memset"; "Memcpy Unknown"
    otherwise) and each adds its ``memory bandwidth (GB/s)`` while it runs. The series is the
    aggregate GB/s per kind after every copy start and end (one row each, ends before starts at
    equal times; a copy of duration 0 counts as 1 µs, as HTA does, issue #20). The summary is
    ``describe()`` of the non-zero points per rank and kind, as HTA.

Times are µs on the trace's own clock (HTA shifts every rank so the earliest event is 0).
"""

from __future__ import annotations

import polars as pl

from kinetoscope.analysis._common import (
    CORE_READS,
    TraceInput,
    describe_aggs,
    describe_schema,
    device_frame,
    memo,
    per_rank,
    rank_lit,
)
from kinetoscope.analysis.kernel_types import MEMORY
from kinetoscope.analysis.launch_stats import launch_pairs
from kinetoscope.analysis.registry import AnalysisSpec, register
from kinetoscope.trace.model import Trace

CUDA_MAX_LAUNCH_QUEUE_PER_STREAM = 1024

QUEUE_TS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "stream": pl.Int64(),
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    "ts": pl.Float64(),
    "queue_length": pl.Int64(),
}
QUEUE_SUMMARY_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "stream": pl.Int64(),
    **describe_schema(),
    "time_weighted_mean": pl.Float64(),
    "skewed_starts": pl.Int64(),
}
BLOCKED_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "stream": pl.Int64(),
    "duration_at_max_queue_length": pl.Float64(),
    "relative_duration_at_max_queue_length": pl.Float64(),
    "max_queue_length_seen": pl.Int64(),
}
MEMBW_TS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "name": pl.String(),
    "ts": pl.Float64(),
    "memory_bw_gbps": pl.Float64(),
}
MEMBW_SUMMARY_SCHEMA: dict[str, pl.DataType] = {"rank": pl.Int64(), "name": pl.String(), **describe_schema()}


# ---- queue length ---------------------------------------------------------------------------


def _queue_points(trace: Trace) -> pl.DataFrame:
    """Change points (ns) per stream: ``stream, pid, tid, ts, queue_length, dt`` where ``dt`` is
    the time to the next change point on the stream (null for the last), plus ``_skewed``."""
    return memo(trace, "queue_points", lambda: _build_queue_points(trace))


def _build_queue_points(trace: Trace) -> pl.DataFrame:
    pairs = launch_pairs(trace)
    if pairs.is_empty():
        return pl.DataFrame(
            schema={
                "stream": pl.Int64,
                "pid": pl.Int64,
                "tid": pl.Int64,
                "ts": pl.Int64,
                "queue_length": pl.Int64,
                "dt": pl.Int64,
                "_skewed": pl.Boolean,
            }
        )
    pairs = pairs.with_columns(
        _skewed=pl.col("ts") < pl.col("launch_ts"),
        _deq=pl.max_horizontal("ts", "launch_ts"),
    )
    points = pl.concat(
        [
            pairs.select(
                "stream", "pid", "tid", pl.col("launch_ts").alias("ts"), pl.lit(1).alias("d"), "_skewed"
            ),
            pairs.select(
                "stream",
                "pid",
                "tid",
                pl.col("_deq").alias("ts"),
                pl.lit(-1).alias("d"),
                pl.lit(False).alias("_skewed"),
            ),
        ]
    )
    return (
        points.sort(["stream", "ts", "d"], descending=[False, False, True])
        .with_columns(
            queue_length=pl.col("d").cum_sum().over("stream").cast(pl.Int64),
            dt=(pl.col("ts").shift(-1) - pl.col("ts")).over("stream"),
        )
        .select("stream", "pid", "tid", "ts", "queue_length", "dt", "_skewed")
    )


def queue_length_time_series(traces: TraceInput) -> pl.DataFrame:
    """``rank, stream, pid, tid, ts (µs), queue_length``: one row per change point."""

    def one_rank(t: Trace) -> pl.DataFrame | None:
        pts = _queue_points(t)
        if pts.is_empty():
            return None
        return pts.select(
            rank_lit(t),
            "stream",
            "pid",
            "tid",
            (pl.col("ts") / 1000.0).alias("ts"),
            "queue_length",
        )

    return per_rank(traces, one_rank, QUEUE_TS_SCHEMA)


def queue_length_summary(traces: TraceInput) -> pl.DataFrame:
    """``describe()`` of the queue length per rank and stream (see module docstring)."""

    def one_rank(t: Trace) -> pl.DataFrame | None:
        pts = _queue_points(t)
        if pts.is_empty():
            return None
        return (
            pts.group_by("stream")
            .agg(
                *describe_aggs("queue_length"),
                ((pl.col("queue_length") * pl.col("dt")).sum() / pl.col("dt").sum()).alias(
                    "time_weighted_mean"
                ),
                pl.col("_skewed").sum().cast(pl.Int64).alias("skewed_starts"),
            )
            .with_columns(rank_lit(t))
        )

    return per_rank(traces, one_rank, QUEUE_SUMMARY_SCHEMA).sort("rank", "stream", nulls_last=True)


def time_blocked_on_full_queue(
    traces: TraceInput, max_queue_length: int = CUDA_MAX_LAUNCH_QUEUE_PER_STREAM
) -> pl.DataFrame:
    """Per rank and stream: time at or above ``max_queue_length`` (see module docstring)."""

    def one_rank(t: Trace) -> pl.DataFrame | None:
        pts = _queue_points(t)
        if pts.is_empty():
            return None
        duration = int(t.events["ts"].max() - t.events["ts"].min())  # type: ignore[operator, arg-type]
        full = pl.col("queue_length") >= max_queue_length
        return (
            pts.group_by("stream")
            .agg(
                pl.col("dt").filter(full).sum().alias("_blocked"),
                pl.col("queue_length").max().alias("max_queue_length_seen"),
            )
            .select(
                rank_lit(t),
                "stream",
                (pl.col("_blocked") / 1000.0).alias("duration_at_max_queue_length"),
                (pl.col("_blocked") / duration if duration > 0 else pl.lit(None, dtype=pl.Float64)).alias(
                    "relative_duration_at_max_queue_length"
                ),
                "max_queue_length_seen",
            )
        )

    return per_rank(traces, one_rank, BLOCKED_SCHEMA).sort("rank", "stream", nulls_last=True)


# ---- memory bandwidth -----------------------------------------------------------------------


def memory_kind_expr(name: str = "name") -> pl.Expr:
    """HTA's ``get_memory_kernel_type``: "Memset", "Memcpy Unknown", or the first 11 chars."""
    col = pl.col(name)
    return (
        pl.when(col.str.starts_with("Memset"))
        .then(pl.lit("Memset"))
        .when(~col.str.starts_with("Memcpy"))
        .then(pl.lit("Memcpy Unknown"))
        .otherwise(col.str.slice(0, 11))
    )


def _membw_points(trace: Trace) -> pl.DataFrame:
    mem = device_frame(trace).filter(
        (pl.col("kernel_type") == MEMORY) & pl.col("memory_bw_gbps").is_not_null()
    )
    if mem.is_empty():
        return pl.DataFrame(schema={"name": pl.String, "ts": pl.Int64, "memory_bw_gbps": pl.Float64})
    # HTA issue #20: a copy shorter than the trace's resolution has dur 0; count it as 1 µs.
    mem = mem.with_columns(
        kind=memory_kind_expr(),
        end=pl.when(pl.col("dur") <= 0).then(pl.col("ts") + 1000).otherwise(pl.col("end")),
    )
    points = pl.concat(
        [
            mem.select(pl.col("kind").alias("name"), "ts", pl.col("memory_bw_gbps").alias("d")),
            mem.select(
                pl.col("kind").alias("name"),
                pl.col("end").alias("ts"),
                (-pl.col("memory_bw_gbps")).alias("d"),
            ),
        ]
    )
    return (
        # at equal times, ends before starts: the value never shows two back-to-back copies at once
        points.sort(["name", "ts", "d"])
        .with_columns(memory_bw_gbps=pl.col("d").cum_sum().over("name"))
        # float noise: a value that should be 0 after + and - of the same numbers
        .with_columns(
            memory_bw_gbps=pl.when(pl.col("memory_bw_gbps").abs() < 1e-9)
            .then(0.0)
            .otherwise(pl.col("memory_bw_gbps"))
        )
        .select("name", "ts", "memory_bw_gbps")
    )


def memory_bw_time_series(traces: TraceInput) -> pl.DataFrame:
    """``rank, name, ts (µs), memory_bw_gbps``: aggregate GB/s per memory kind over time."""

    def one_rank(t: Trace) -> pl.DataFrame | None:
        pts = _membw_points(t)
        if pts.is_empty():
            return None
        return pts.select(
            rank_lit(t),
            "name",
            (pl.col("ts") / 1000.0).alias("ts"),
            "memory_bw_gbps",
        )

    return per_rank(traces, one_rank, MEMBW_TS_SCHEMA)


def memory_bw_summary(traces: TraceInput) -> pl.DataFrame:
    """``describe()`` of the non-zero bandwidth points per rank and memory kind."""

    def one_rank(t: Trace) -> pl.DataFrame | None:
        pts = _membw_points(t).filter(pl.col("memory_bw_gbps") > 0)
        if pts.is_empty():
            return None
        return pts.group_by("name").agg(describe_aggs("memory_bw_gbps")).with_columns(rank_lit(t))

    return per_rank(traces, one_rank, MEMBW_SUMMARY_SCHEMA).sort("rank", "name", nulls_last=True)


register(
    AnalysisSpec(
        name="queue_length_summary",
        func=queue_length_summary,
        combine="concat_by_rank",
        reads=CORE_READS,
        description="Launch-queue length per rank and stream (operations launched but not yet started).",
        order=70,
        group="counters",
        empty_note="no kernel launches with a matching device event",
    )
)
register(
    AnalysisSpec(
        name="time_blocked_on_full_queue",
        func=time_blocked_on_full_queue,
        combine="concat_by_rank",
        reads=CORE_READS,
        description="Time each stream's launch queue is full (>= max_queue_length, default 1024).",
        options={"max_queue_length": CUDA_MAX_LAUNCH_QUEUE_PER_STREAM},
        order=71,
        group="counters",
        empty_note="no kernel launches with a matching device event",
    )
)
register(
    AnalysisSpec(
        name="queue_length_time_series",
        func=queue_length_time_series,
        combine="concat",
        reads=CORE_READS,
        description="Launch-queue length per stream at every change (one row per launch and per kernel start).",
        default=False,
        order=72,
        group="counters",
        empty_note="no kernel launches with a matching device event",
    )
)
register(
    AnalysisSpec(
        name="memory_bw_summary",
        func=memory_bw_summary,
        combine="concat_by_rank",
        reads=CORE_READS,
        description="Memory copy/set bandwidth (GB/s) per rank and kind: statistics over time.",
        order=73,
        group="counters",
        empty_note="no memcpy/memset events with a bandwidth",
    )
)
register(
    AnalysisSpec(
        name="memory_bw_time_series",
        func=memory_bw_time_series,
        combine="concat",
        reads=CORE_READS,
        description="Aggregate memory copy/set bandwidth (GB/s) per kind at every change.",
        default=False,
        order=74,
        group="counters",
        empty_note="no memcpy/memset events with a bandwidth",
    )
)
