"""GPU kernel breakdown: time by kernel type (exclusive and overlapping) and the top kernels.

Definitions (HTA §1.7, ``BreakdownAnalysis.get_gpu_kernel_breakdown``), per rank, over device
events classified by ``kernel_types`` (COMPUTATION, COMMUNICATION, and MEMORY when
``include_memory_kernels``; OTHER is never analysed):

``kernel_type_breakdown`` (HTA's ``kernel_type_df``)
    Each analysed type's intervals are merged and given a bit (COMPUTATION=1, COMMUNICATION=2,
    MEMORY=4). A sweep over all of them labels every instant of GPU-busy time with the set of
    types running: one type gives its name, several give e.g. ``"COMPUTATION overlapping
    COMMUNICATION"`` (bit order). ``sum`` is the time (µs) per label; ``percentage =
    round(100 * sum / rank total, 1)``. The labels partition the union of the analysed kernels,
    so the percentages of a rank add up to 100.

``kernel_breakdown`` (HTA's ``kernel_df``)
    Per type, kernels grouped by full name: ``sum, max, min, mean, stddev`` of their durations
    (µs; stddev is the sample std, 0 for one call) and ``count``. Sorted by ``sum``; when there
    are more than ``num_kernels`` names, a name is folded into ``"others"`` if its position is
    ``>= num_kernels`` or its running total exceeds the ``duration_ratio`` quantile of the
    running totals (HTA's rule, kept so the same kernels are listed).

Deliberate differences from HTA (docs/analysis.md): per-rank type breakdown (HTA sums the
ranks into one table); in the folding branch HTA re-aggregates the already-aggregated sums, so
every listed kernel gets ``max == min == mean == sum`` and ``stddev == 0`` and "others" gets
statistics over per-kernel sums; here every row's statistics are over the individual kernel
calls it covers (``others`` included), and ``count`` is added. Zero-length label segments are
not reported (HTA can list a label with ``sum == 0``).
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from kinetoscope.analysis._common import (
    CORE_READS,
    TraceInput,
    concat_or_empty,
    device_frame,
    per_rank,
    rank_lit,
)
from kinetoscope.analysis.intervals import ENGINE, covered_pieces, sweep_states
from kinetoscope.analysis.kernel_types import COMMUNICATION, COMPUTATION, MEMORY
from kinetoscope.analysis.registry import AnalysisSpec, register
from kinetoscope.trace.model import Trace

OTHERS = "others"

KERNEL_TYPE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "kernel_type": pl.String(),
    "sum": pl.Float64(),
    "percentage": pl.Float64(),
}
KERNEL_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "kernel_type": pl.String(),
    "name": pl.String(),
    "count": pl.Int64(),
    "sum (us)": pl.Float64(),
    "max (us)": pl.Float64(),
    "min (us)": pl.Float64(),
    "stddev": pl.Float64(),
    "mean (us)": pl.Float64(),
}


def analysed_types(include_memory_kernels: bool = True) -> list[str]:
    return [COMPUTATION, COMMUNICATION] + ([MEMORY] if include_memory_kernels else [])


def _state_labels(types: Sequence[str]) -> pl.DataFrame:
    rows = []
    for state in range(1, 1 << len(types)):
        parts = [t for i, t in enumerate(types) if state & (1 << i)]
        rows.append((state, " overlapping ".join(parts)))
    return pl.DataFrame(rows, schema={"state": pl.Int64, "kernel_type": pl.String}, orient="row")


def kernel_type_time(dev: pl.DataFrame, types: Sequence[str], keys: Sequence[str] = ()) -> pl.DataFrame:
    """Exclusive/overlapping time (ns) per label: ``keys..., kernel_type, time``."""
    keys = list(keys)
    bits = pl.DataFrame({"kernel_type": list(types), "bit": [1 << i for i in range(len(types))]})
    sel = dev.filter(pl.col("kernel_type").is_in(list(types))).join(bits, on="kernel_type")
    if sel.is_empty():
        return pl.DataFrame(
            schema={**{k: dev.schema[k] for k in keys}, "kernel_type": pl.String, "time": pl.Int64}
        )
    merged = covered_pieces(sel, [*keys, "bit"])
    segs = sweep_states(merged, keys).with_columns(time=pl.col("next_t") - pl.col("t"))
    return (
        segs.group_by([*keys, "state"])
        .agg(pl.col("time").sum())
        .collect(engine=ENGINE)
        .join(_state_labels(types), on="state")
        .select([*keys, "kernel_type", "time"])
    )


def kernel_type_breakdown(traces: TraceInput, include_memory_kernels: bool = True) -> pl.DataFrame:
    """``rank, kernel_type, sum (µs), percentage`` (see module docstring)."""
    types = analysed_types(include_memory_kernels)

    def one_rank(t: Trace) -> pl.DataFrame | None:
        dev = device_frame(t)
        if dev.is_empty():
            return None
        kt = kernel_type_time(dev, types)
        if kt.is_empty():
            return None
        total = kt["time"].sum()
        return kt.select(
            rank_lit(t),
            "kernel_type",
            (pl.col("time") / 1000.0).alias("sum"),
            (100.0 * pl.col("time") / total).round(1).alias("percentage"),
        )

    out = per_rank(traces, one_rank, KERNEL_TYPE_SCHEMA)
    return out.sort(["rank", "sum", "kernel_type"], descending=[False, True, False], nulls_last=True)


def top_durations(
    events: pl.DataFrame,
    *,
    group_col: str = "name",
    num_kernels: int = 10,
    duration_ratio: float = 0.8,
    allowlist: Sequence[str] | None = None,
) -> pl.DataFrame:
    """Duration statistics per ``group_col`` with HTA's folding into ``"others"``.

    ``events`` needs ``group_col`` and ``dur`` (ns). Returns ``name, count, sum (us), max (us),
    min (us), stddev, mean (us)`` sorted by sum (``others`` last); statistics are over the
    individual events each row covers. Names in ``allowlist`` are never folded.
    """
    per = (
        events.group_by(group_col)
        .agg(pl.col("dur").sum().alias("_sum"))
        .sort(["_sum", group_col], descending=[True, False])
        .with_row_index("_pos")
    )
    if per.height > num_kernels:
        per = per.with_columns(_cum=pl.col("_sum").cum_sum())
        q = per.select(pl.col("_cum").cast(pl.Float64).quantile(duration_ratio, "linear")).item()
        keep = pl.lit(True) if not allowlist else pl.col(group_col).is_in(list(allowlist))
        fold = ~keep if allowlist else pl.lit(True)
        per = per.with_columns(
            _label=pl.when(fold & ((pl.col("_cum") > q) | (pl.col("_pos") >= num_kernels)))
            .then(pl.lit(OTHERS))
            .otherwise(pl.col(group_col))
        )
    else:
        per = per.with_columns(_label=pl.col(group_col))
    labelled = events.join(per.select(group_col, "_label"), on=group_col, how="left")
    d = pl.col("dur").cast(pl.Float64) / 1000.0
    stats = labelled.group_by("_label").agg(
        pl.len().cast(pl.Int64).alias("count"),
        d.sum().alias("sum (us)"),
        d.max().alias("max (us)"),
        d.min().alias("min (us)"),
        d.std().fill_null(0.0).fill_nan(0.0).alias("stddev"),
        d.mean().alias("mean (us)"),
    )
    return (
        stats.rename({"_label": "name"})
        .with_columns(_o=(pl.col("name") == OTHERS))
        .sort(["_o", "sum (us)", "name"], descending=[False, True, False])
        .drop("_o")
    )


def kernel_breakdown(
    traces: TraceInput,
    num_kernels: int = 10,
    duration_ratio: float = 0.8,
    include_memory_kernels: bool = True,
) -> pl.DataFrame:
    """Top kernels per rank and type (see module docstring)."""
    types = analysed_types(include_memory_kernels)

    def one_rank(t: Trace) -> pl.DataFrame:
        dev = device_frame(t)
        frames = []
        for kt in types:
            sel = dev.filter(pl.col("kernel_type") == kt)
            if sel.is_empty():
                continue
            top = top_durations(sel, num_kernels=num_kernels, duration_ratio=duration_ratio)
            frames.append(top.with_columns(rank_lit(t), pl.lit(kt).alias("kernel_type")))
        return concat_or_empty(frames, KERNEL_SCHEMA)

    return per_rank(traces, one_rank, KERNEL_SCHEMA)


_OPTS = {"num_kernels": 10, "duration_ratio": 0.8, "include_memory_kernels": True}
register(
    AnalysisSpec(
        name="kernel_type_breakdown",
        func=kernel_type_breakdown,
        combine="concat_by_rank",
        reads=CORE_READS,
        description="GPU busy time per rank by kernel type, exclusive and overlapping (compute/comm/memory).",
        options={"include_memory_kernels": True},
        order=30,
    )
)
register(
    AnalysisSpec(
        name="kernel_breakdown",
        func=kernel_breakdown,
        combine="concat",
        reads=CORE_READS,
        description="Top kernels per rank and kernel type with per-call duration statistics.",
        options=_OPTS,
        order=31,
    )
)
