"""CUPTI counters per kernel with the operators that launched them (HTA
``get_cupti_counter_data_with_operators``, §1.15).

With the CUPTI profiler (range) mode, Kineto writes one ``cuda_profiler_range`` complete event
per kernel, named after the kernel, whose ``args`` are the requested counters (e.g.
``smsp__sass_thread_inst_executed_op_ffma_pred_on.sum``); there are no ``kernel`` events.

Definition, per trace (one rank), as HTA:

* the ``cuda_profiler_range`` events in time order are paired **by position** with the
  ``cuda_runtime`` calls named ``cudaLaunchKernel*`` in time order; when the two counts differ
  the trace yields no rows (HTA logs an error and skips the rank);
* for each pair, ``op_stack`` is the ``cpu_op`` ancestors of the launch in the call graph,
  outermost first; ``top_level_op`` / ``bottom_level_op`` are its ends (``""`` when the launch
  is outside every op, where HTA raises ``IndexError``);
* the counter values become one column per counter; ``flops`` (our addition) is HTA's
  ``CUDA_SASS_INSTRUCTION_COUNTER_FLOPS`` weighting (2 per FMA, 1 per add/mul) of the SASS
  instruction counters present, null when none is.

Counter values come from the trace's ``counters`` table: the loader writes one row per numeric
``args`` value of every ``cuda_profiler_range`` event (``idx`` = the event's index, ``key`` =
the counter name, ``value`` as Float64; see docs/trace-loading.md), so the trace file is not
read again.
"""

from __future__ import annotations

import polars as pl

from kinetoscope.analysis._common import TraceInput, per_rank_frames, rank_lit
from kinetoscope.analysis.call_graph import CallGraph, build_call_graph
from kinetoscope.analysis.reads import CUPTI_READS
from kinetoscope.analysis.registry import AnalysisSpec, register
from kinetoscope.trace.model import Trace

CUDA_SASS_INSTRUCTION_COUNTER_FLOPS: dict[str, float] = {
    f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum": 2 if "fma" in op else 1
    for op in ("ffma", "fmul", "fadd", "hfma", "hmul", "hadd", "dfma", "dmul", "dadd")
}

BASE_COLUMNS: dict[str, pl.DataType] = {
    "idx": pl.Int64(),
    "name": pl.String(),
    "cat": pl.String(),
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    "ts": pl.Int64(),
    "dur": pl.Int64(),
    "index_runtime": pl.Int64(),
    "op_stack": pl.List(pl.String()),
    "top_level_op": pl.String(),
    "bottom_level_op": pl.String(),
}


def profiler_range_events(trace: Trace) -> pl.DataFrame:
    return trace.events.filter(pl.col("kind") == "cuda_profiler_range").sort("ts", "idx")


def counter_values(trace: Trace, idx: list[int] | None = None) -> pl.DataFrame:
    """``idx`` plus one Float64 column per counter (``args`` key) of the ``cuda_profiler_range``
    events (all of them, or those in ``idx``, in that order), from ``trace.counters``; a
    counter an event does not have is null."""
    if idx is None:
        idx = profiler_range_events(trace)["idx"].to_list()
    if not idx:
        return pl.DataFrame(schema={"idx": pl.Int64})
    rows = trace.counters.filter(pl.col("idx").is_in(idx)).select("idx", "key", "value")
    keys = rows["key"].unique(maintain_order=True).to_list()
    base = pl.DataFrame({"idx": idx}, schema={"idx": pl.Int64})
    if not keys:
        return base
    wide = rows.pivot(on="key", index="idx", values="value", aggregate_function="first")
    return base.join(wide, on="idx", how="left").select("idx", *[pl.col(k).cast(pl.Float64) for k in keys])


def counter_data_with_operators(trace: Trace, *, call_graph: CallGraph | None = None) -> pl.DataFrame:
    """Kernel counter rows with ``op_stack``, ``top_level_op``, ``bottom_level_op``, the counter
    columns and ``flops`` (see module docstring). Empty when the trace has no counter events or
    the counts of counter events and launches differ."""
    ranges = profiler_range_events(trace)
    if ranges.is_empty():
        return pl.DataFrame(schema=BASE_COLUMNS)
    launches = trace.events.filter(
        (pl.col("kind") == "cuda_runtime") & pl.col("name").str.starts_with("cudaLaunchKernel")
    ).sort("ts", "idx")
    if launches.height != ranges.height:
        return pl.DataFrame(schema=BASE_COLUMNS)
    cg = call_graph or build_call_graph(trace)
    nodes = cg.nodes
    is_op = (~nodes["is_device"] & (nodes["kind"] == "cpu_op")).to_numpy()
    names = nodes["name"].to_list()
    parent = cg.parent_positions
    stacks: list[list[str]] = []
    for p in cg.positions(launches["idx"].to_numpy()).tolist():
        ops: list[str] = []
        q = int(parent[p]) if p >= 0 else -1
        while q >= 0:
            if is_op[q]:
                ops.append(names[q])
            q = int(parent[q])
        ops.reverse()
        stacks.append(ops)
    out = (
        ranges.select("idx", "name", "cat", "pid", "tid", "ts", "dur")
        .with_columns(
            pl.Series("index_runtime", launches["idx"].to_list(), dtype=pl.Int64),
            pl.Series("op_stack", stacks, dtype=pl.List(pl.String)),
        )
        .with_columns(
            pl.col("op_stack").list.first().fill_null("").alias("top_level_op"),
            pl.col("op_stack").list.last().fill_null("").alias("bottom_level_op"),
        )
    )
    values = counter_values(trace, out["idx"].to_list())
    out = out.join(values, on="idx", how="left")
    present = [k for k in CUDA_SASS_INSTRUCTION_COUNTER_FLOPS if k in out.columns]
    if present:
        out = out.with_columns(
            pl.sum_horizontal(
                [pl.col(k).fill_null(0) * CUDA_SASS_INSTRUCTION_COUNTER_FLOPS[k] for k in present]
            ).alias("flops")
        )
    else:
        out = out.with_columns(pl.lit(None, dtype=pl.Float64).alias("flops"))
    return out


def cupti_counters(traces: TraceInput) -> pl.DataFrame:
    """Registry entry: ``counter_data_with_operators`` per trace with a ``rank`` column, times
    in µs, ``op_stack`` joined with `` > ``."""

    def one_rank(t: Trace) -> pl.DataFrame | None:
        df = counter_data_with_operators(t)
        if df.is_empty():
            return None
        return df.with_columns(
            rank_lit(t),
            (pl.col("ts") / 1000).alias("ts"),
            (pl.col("dur") / 1000).alias("dur"),
            pl.col("op_stack").list.join(" > "),
        ).select("rank", pl.exclude("rank"))

    frames = per_rank_frames(traces, one_rank)
    if not frames:
        return pl.DataFrame(
            schema={
                "rank": pl.Int64(),
                **{k: (pl.String() if k == "op_stack" else v) for k, v in BASE_COLUMNS.items()},
            }
        )
    return pl.concat(frames, how="diagonal_relaxed")


register(
    AnalysisSpec(
        name="cupti_counters",
        func=cupti_counters,
        combine="concat",
        reads=CUPTI_READS,
        description="CUPTI profiler counters per kernel (cuda_profiler_range events) with the ops that launched it.",
        default=False,
        needs_gpu=False,
        order=88,
        group="counters",
        empty_note="no cuda_profiler_range events, or their count differs from the kernel launches",
    )
)
