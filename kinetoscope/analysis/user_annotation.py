"""GPU user annotations: time per annotation, and the annotation each kernel runs under.

Definitions (HTA §1.9):

``gpu_user_annotation_breakdown`` (HTA ``get_gpu_user_annotation_breakdown``)
    Events with category ``gpu_user_annotation`` (the device-timeline copy of
    ``record_function`` ranges; with ``use_gpu_annotation=False`` the host-side
    ``user_annotation`` events instead) grouped by name per rank: ``count, sum, max, min,
    stddev, mean`` of their durations (µs), folded into ``others`` past ``num_kernels`` names
    exactly as in ``kernel_breakdown`` (default ``num_kernels=1000``, so rarely). Names matching
    a regex of ``allowlist_patterns`` are never folded.

``gpu_kernels_with_user_annotations`` (HTA ``get_gpu_kernels_with_user_annotations``)
    Every device event with the GPU user annotation it runs under: among the
    ``gpu_user_annotation`` events on the same ``pid`` and ``tid`` (device and stream) whose
    ``[ts, ts+dur)`` overlaps the kernel's ``[ts, ts+dur)``, the shortest one (the leaf of the
    annotation stack; ties: the later start). ``user_annotation`` is null when none overlaps.

Differences from HTA: the kernel/annotation matching is one interval join (no loop over
annotations × kernels), ties are broken deterministically, and it runs on every rank given
(HTA's takes one rank). Kernels are device events (kernels, memcpy, memset); HTA's filter also
passes ``Event Sync``/``Context Sync`` rows. Without annotations the result is an empty frame
(HTA returns None with a warning).
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from kinetoscope.analysis._common import CORE_READS, TraceInput, device_frame, per_rank, rank_lit
from kinetoscope.analysis.kernel_breakdown import top_durations
from kinetoscope.analysis.registry import AnalysisSpec, register
from kinetoscope.trace.model import Trace

ANNOTATION_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "name": pl.String(),
    "count": pl.Int64(),
    "sum (us)": pl.Float64(),
    "max (us)": pl.Float64(),
    "min (us)": pl.Float64(),
    "stddev": pl.Float64(),
    "mean (us)": pl.Float64(),
}
KERNEL_ANNOTATION_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "idx": pl.Int64(),
    "name": pl.String(),
    "kind": pl.String(),
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    "stream": pl.Int64(),
    "correlation": pl.Int64(),
    "ts(us)": pl.Float64(),
    "dur(us)": pl.Float64(),
    "user_annotation": pl.String(),
}


def gpu_user_annotation_breakdown(
    traces: TraceInput,
    use_gpu_annotation: bool = True,
    num_kernels: int = 1000,
    duration_ratio: float = 0.8,
    allowlist_patterns: Sequence[str] | None = None,
) -> pl.DataFrame:
    """``rank, name, count, sum/max/min/mean (µs), stddev`` per annotation name."""
    kind = "gpu_user_annotation" if use_gpu_annotation else "user_annotation"

    def one_rank(t: Trace) -> pl.DataFrame | None:
        ann = t.events.filter(pl.col("kind") == kind)
        if ann.is_empty():
            return None
        allow = None
        if allowlist_patterns:
            pat = "|".join(f"(?:{p})" for p in allowlist_patterns)
            allow = ann.filter(pl.col("name").str.contains(pat))["name"].unique().to_list()
        top = top_durations(ann, num_kernels=num_kernels, duration_ratio=duration_ratio, allowlist=allow)
        return top.with_columns(rank_lit(t))

    return per_rank(traces, one_rank, ANNOTATION_SCHEMA).sort("rank", "name", nulls_last=True)


def annotate_device_events(trace_events: pl.DataFrame, device: pl.DataFrame) -> pl.DataFrame:
    """``device`` (needs ``idx, pid, tid, ts, dur``) plus ``user_annotation``: the leaf
    ``gpu_user_annotation`` of ``trace_events`` overlapping each row on the same pid/tid."""
    ann = trace_events.filter(pl.col("kind") == "gpu_user_annotation").select(
        pl.col("idx").alias("_a_idx"),
        pl.col("name").alias("_a_name"),
        pl.col("pid").alias("_a_pid"),
        pl.col("tid").alias("_a_tid"),
        pl.col("ts").alias("_a_ts"),
        (pl.col("ts") + pl.col("dur")).alias("_a_end"),
        pl.col("dur").alias("_a_dur"),
    )
    if ann.is_empty() or device.is_empty():
        return device.with_columns(pl.lit(None, dtype=pl.String).alias("user_annotation"))
    k = device.select("idx", "pid", "tid", "ts", (pl.col("ts") + pl.col("dur")).alias("_end"))
    pairs = (
        k.join_where(ann, pl.col("ts") < pl.col("_a_end"), pl.col("_a_ts") < pl.col("_end"))
        .filter((pl.col("pid") == pl.col("_a_pid")) & (pl.col("tid") == pl.col("_a_tid")))
        .sort(["idx", "_a_dur", "_a_ts", "_a_idx"], descending=[False, False, True, True])
        .group_by("idx", maintain_order=True)
        .first()
        .select("idx", pl.col("_a_name").alias("user_annotation"))
    )
    return device.join(pairs, on="idx", how="left")


def gpu_kernels_with_user_annotations(traces: TraceInput) -> pl.DataFrame:
    """One row per device event of every rank that has GPU user annotations (see module doc)."""

    def one_rank(t: Trace) -> pl.DataFrame | None:
        if t.events.filter(pl.col("kind") == "gpu_user_annotation").is_empty():
            return None
        dev = device_frame(t)
        out = annotate_device_events(t.events, dev)
        return out.select(
            rank_lit(t),
            "idx",
            "name",
            pl.col("kind").cast(pl.String),
            "pid",
            "tid",
            "stream",
            "correlation",
            (pl.col("ts") / 1000.0).alias("ts(us)"),
            (pl.col("dur") / 1000.0).alias("dur(us)"),
            "user_annotation",
        ).sort("ts(us)", "idx")

    return per_rank(traces, one_rank, KERNEL_ANNOTATION_SCHEMA)


register(
    AnalysisSpec(
        name="gpu_user_annotation_breakdown",
        func=gpu_user_annotation_breakdown,
        combine="concat_by_rank",
        reads=CORE_READS,
        description="Time per GPU user annotation (record_function ranges on the GPU timeline), per rank.",
        options={
            "use_gpu_annotation": True,
            "num_kernels": 1000,
            "duration_ratio": 0.8,
            "allowlist_patterns": None,
        },
        order=50,
        group="annotations",
        empty_note="no gpu_user_annotation events",
    )
)
register(
    AnalysisSpec(
        name="gpu_kernels_with_user_annotations",
        func=gpu_kernels_with_user_annotations,
        combine="concat",
        reads=CORE_READS,
        description="Every GPU kernel with the innermost GPU user annotation it runs under (one row per kernel).",
        default=False,
        order=51,
        group="annotations",
        empty_note="no gpu_user_annotation events",
    )
)
