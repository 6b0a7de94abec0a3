"""Kernel launch statistics: CPU cost of each launch, GPU duration and launch delay.

Definition (HTA §1.10, ``CudaKernelAnalysis.cuda_kernel_launch_stats``), per rank: every host
launch call (``kernel_types.KERNEL_LAUNCH_NAMES``, plus ``MEMORY_LAUNCH_NAMES`` when
``include_memory_events``) is paired with the device event carrying the same ``correlation``:

* ``cpu_duration`` = duration of the launch call (µs);
* ``gpu_duration`` = duration of the device event (µs);
* ``launch_delay`` = device start − launch end, clipped at 0 (µs).

``kernel_launch_summary`` counts, per rank, HTA's three classes:

* **short kernels**: ``cpu_duration <= runtime_cutoff_us`` (50) and ``gpu_duration <
  cpu_duration`` (launching costs more than running: candidates for fusion / CUDA graphs);
* **runtime outliers**: ``cpu_duration > runtime_cutoff_us``;
* **launch-delay outliers**: ``launch_delay > launch_delay_cutoff_us`` (100);

with their percentages of all launches, the mean and p99 of ``cpu_duration`` and
``gpu_duration``, and the mean / p50 / p99 / max of ``launch_delay``.

Difference from HTA: HTA knows only ``cudaLaunchKernel``, ``cudaLaunchKernelExC`` and MTIA's
``runFunction`` (+ ``cudaMemcpyAsync``/``cudaMemsetAsync``), so Triton's ``cuLaunchKernel``
and every AMD ``hip*`` launch are missing from its statistics; we include them. HTA only draws
the three classes as histograms; the summary is ours. CUDA-graph launches (one call, many
kernels) are not launches here.
"""

from __future__ import annotations

from typing import cast

import polars as pl

from kinetoscope.analysis._common import (
    CORE_READS,
    TraceInput,
    as_traces,
    concat_or_empty,
    device_frame,
    memo,
    per_rank,
    rank_lit,
)
from kinetoscope.analysis.intervals import ENGINE
from kinetoscope.analysis.kernel_types import KERNEL_LAUNCH_NAMES, LAUNCH_NAMES
from kinetoscope.analysis.registry import AnalysisSpec, register
from kinetoscope.trace.model import Trace
from kinetoscope.trace.schema import RUNTIME_KINDS

LAUNCH_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "correlation": pl.Int64(),
    "launch_name": pl.String(),
    "name": pl.String(),
    "stream": pl.Int64(),
    "cpu_duration": pl.Float64(),
    "gpu_duration": pl.Float64(),
    "launch_delay": pl.Float64(),
}
SUMMARY_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "launches": pl.Int64(),
    "short_kernels": pl.Int64(),
    "short_kernels_pctg": pl.Float64(),
    "runtime_outliers": pl.Int64(),
    "runtime_outliers_pctg": pl.Float64(),
    "launch_delay_outliers": pl.Int64(),
    "launch_delay_outliers_pctg": pl.Float64(),
    **{
        f"{col}_{stat}(us)": pl.Float64()
        for col, stats in (
            ("cpu_duration", ("mean", "p99")),
            ("gpu_duration", ("mean", "p99")),
            ("launch_delay", ("mean", "p50", "p99", "max")),
        )
        for stat in stats
    },
}


def launch_pairs(trace: Trace, launch_names: tuple[str, ...] | list[str] = LAUNCH_NAMES) -> pl.DataFrame:
    """Launch call -> device event pairs (ns): ``correlation, launch_name, launch_ts,
    launch_dur, name, kind, stream, pid, tid, ts, dur`` (pid/tid/ts/dur of the device event)."""
    return memo(trace, f"launch_pairs:{','.join(launch_names)}", lambda: _launch_pairs(trace, launch_names))


def _launch_pairs(trace: Trace, launch_names: tuple[str, ...] | list[str]) -> pl.DataFrame:
    host = (
        trace.events.lazy()
        .select("kind", "name", "correlation", "ts", "dur")
        .filter(pl.col("kind").is_in(list(RUNTIME_KINDS)) & pl.col("correlation").is_not_null())
        .filter(pl.col("name").is_in(list(launch_names)))
        .select(
            "correlation",
            pl.col("name").alias("launch_name"),
            pl.col("ts").alias("launch_ts"),
            pl.col("dur").alias("launch_dur"),
        )
        .collect(engine=ENGINE)
    )
    dev = (
        device_frame(trace)
        .filter(pl.col("correlation").is_not_null())
        .select("correlation", "name", "kind", "stream", "pid", "tid", "ts", "dur")
    )
    return host.join(dev, on="correlation", how="inner")


def kernel_launch_stats(traces: TraceInput, include_memory_events: bool = True) -> pl.DataFrame:
    """One row per launch (see module docstring); µs."""
    names = LAUNCH_NAMES if include_memory_events else KERNEL_LAUNCH_NAMES

    def one_rank(t: Trace) -> pl.DataFrame | None:
        pairs = launch_pairs(t, names)
        if pairs.is_empty():
            return None
        return pairs.sort("launch_ts", "correlation").select(
            rank_lit(t),
            "correlation",
            "launch_name",
            "name",
            "stream",
            (pl.col("launch_dur") / 1000.0).alias("cpu_duration"),
            (pl.col("dur") / 1000.0).alias("gpu_duration"),
            ((pl.col("ts") - pl.col("launch_ts") - pl.col("launch_dur")).clip(lower_bound=0) / 1000.0).alias(
                "launch_delay"
            ),
        )

    return per_rank(traces, one_rank, LAUNCH_SCHEMA)


def kernel_launch_summary(
    traces: TraceInput,
    runtime_cutoff_us: float = 50.0,
    launch_delay_cutoff_us: float = 100.0,
    include_memory_events: bool = True,
) -> pl.DataFrame:
    """One row per rank with launches (see module docstring)."""
    pre = [getattr(t, "launch_summary", None) for t in as_traces(traces)]
    if (
        pre
        and all(p is not None for p in pre)
        and (runtime_cutoff_us, launch_delay_cutoff_us, include_memory_events) == (50.0, 100.0, True)
    ):  # digests of ranks (kinetoscope.diagnosis.extract) carry their summary with these defaults
        return concat_or_empty(cast("list[pl.DataFrame]", pre), SUMMARY_SCHEMA).sort("rank", nulls_last=True)
    stats = kernel_launch_stats(traces, include_memory_events)
    if stats.is_empty():
        return pl.DataFrame(schema=SUMMARY_SCHEMA)
    short = (pl.col("cpu_duration") <= runtime_cutoff_us) & (pl.col("gpu_duration") < pl.col("cpu_duration"))
    runtime_out = pl.col("cpu_duration") > runtime_cutoff_us
    delay_out = pl.col("launch_delay") > launch_delay_cutoff_us

    def pct(e: pl.Expr) -> pl.Expr:
        return (100.0 * e.sum() / pl.len()).round(2)

    aggs = [
        pl.len().cast(pl.Int64).alias("launches"),
        short.sum().cast(pl.Int64).alias("short_kernels"),
        pct(short).alias("short_kernels_pctg"),
        runtime_out.sum().cast(pl.Int64).alias("runtime_outliers"),
        pct(runtime_out).alias("runtime_outliers_pctg"),
        delay_out.sum().cast(pl.Int64).alias("launch_delay_outliers"),
        pct(delay_out).alias("launch_delay_outliers_pctg"),
    ]
    for col in ("cpu_duration", "gpu_duration", "launch_delay"):
        c = pl.col(col)
        aggs += [
            c.mean().alias(f"{col}_mean(us)"),
            c.quantile(0.5, "linear").alias(f"{col}_p50(us)"),
            c.quantile(0.99, "linear").alias(f"{col}_p99(us)"),
            c.max().alias(f"{col}_max(us)"),
        ]
    out = stats.group_by("rank").agg(aggs)
    return out.select(list(SUMMARY_SCHEMA)).cast(SUMMARY_SCHEMA).sort("rank", nulls_last=True)  # type: ignore[arg-type]


register(
    AnalysisSpec(
        name="kernel_launch_summary",
        func=kernel_launch_summary,
        combine="concat_by_rank",
        reads=CORE_READS,
        description="Kernel launches per rank: short kernels, runtime and launch-delay outliers, duration stats.",
        options={"runtime_cutoff_us": 50.0, "launch_delay_cutoff_us": 100.0, "include_memory_events": True},
        order=60,
        group="launch",
        empty_note="no kernel launches with a matching device event",
    )
)
register(
    AnalysisSpec(
        name="kernel_launch_stats",
        func=kernel_launch_stats,
        combine="concat",
        reads=CORE_READS,
        description="Every kernel launch: CPU duration, GPU duration and launch delay (one row per launch).",
        options={"include_memory_events": True},
        default=False,
        order=61,
        group="launch",
        empty_note="no kernel launches with a matching device event",
    )
)
