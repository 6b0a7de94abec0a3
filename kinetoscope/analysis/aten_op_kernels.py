"""ATen op -> kernels and launch delays (HTA ``get_aten_op_kernels_and_delay``, §1.11).

Definition, per trace (one rank):

* a kernel launch is a runtime call named like ``cuda*LaunchKernel*``, ``cuLaunchKernel*`` or
  ``runFunction*`` (HTA's ``KERNEL_LAUNCH_CATEGORY_PATTERN``), plus ``hipLaunchKernel`` and
  ``hipExtModuleLaunchKernel`` (not in HTA), that has a device event with its correlation;
* its ATen op is the innermost enclosing op named ``aten::*`` **on the same thread** (from the
  call graph; HTA takes the latest-starting enclosing ``aten::`` op on any thread);
* ``aten_op_delay`` = launch start - op start; ``runtime_delay`` = kernel start - launch start;
* the launches of one op instance give its ``kernel_sequence`` (kernel names in launch order,
  joined with `` -> ``) and its delays are those of its first launch;
* rows: per ``(aten_op_name, kernel_sequence)``, ``occurrence_count`` and the mean delays in µs
  (``avg_aten_op_launch_delay``, ``avg_runtime_delay``, rounded to 3 decimals), sorted by
  ``occurrence_count`` (descending), then name and sequence.

HTA filters every launch against every ATen op (O(launches x ops)) and crashes on a launch
whose kernel is not in the trace (``.item()`` on an empty frame); here it is one call-graph
build and a few joins, and such launches are skipped.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from kinetoscope.analysis._common import TraceInput, per_rank, rank_lit
from kinetoscope.analysis.call_graph import CallGraph, build_call_graph
from kinetoscope.analysis.reads import CALL_GRAPH_READS
from kinetoscope.analysis.registry import AnalysisSpec, register
from kinetoscope.trace.model import Trace

KERNEL_LAUNCH_PATTERN = (
    r"^(?:cuda.*LaunchKernel|cuLaunchKernel|runFunction|hipLaunchKernel|hipExtModuleLaunchKernel)"
)

ATEN_OP_KERNELS_SCHEMA: dict[str, pl.DataType] = {
    "aten_op_name": pl.String(),
    "kernel_sequence": pl.String(),
    "occurrence_count": pl.Int64(),
    "avg_aten_op_launch_delay": pl.Float64(),
    "avg_runtime_delay": pl.Float64(),
}


def aten_op_launches(trace: Trace, *, call_graph: CallGraph | None = None) -> pl.DataFrame:
    """One row per kernel launch inside an ATen op: ``op_idx, aten_op_name, aten_op_start,
    tid, launch_idx, runtime_start, correlation, kernel_name, device_start, aten_op_delay,
    runtime_delay`` (times in ns)."""
    cg = call_graph or build_call_graph(trace, link_backward=False)
    schema = {
        "op_idx": pl.Int64,
        "aten_op_name": pl.String,
        "aten_op_start": pl.Int64,
        "tid": pl.Int64,
        "launch_idx": pl.Int64,
        "runtime_start": pl.Int64,
        "correlation": pl.Int64,
        "kernel_name": pl.String,
        "device_start": pl.Int64,
        "aten_op_delay": pl.Int64,
        "runtime_delay": pl.Int64,
    }
    nodes = cg.nodes
    if nodes.is_empty():
        return pl.DataFrame(schema=schema)
    aten = (~nodes["is_device"] & nodes["name"].str.starts_with("aten::")).to_numpy()
    launch = (
        nodes["kind"].cast(pl.String).is_in(["cuda_runtime", "cuda_driver", "mtia_runtime"])
        & nodes["name"].str.contains(KERNEL_LAUNCH_PATTERN)
    ).to_numpy()
    if not aten.any() or not launch.any():
        return pl.DataFrame(schema=schema)
    op_pos = cg.nearest_ancestor(aten)
    sel = np.flatnonzero(launch & (op_pos >= 0))
    if not len(sel):
        return pl.DataFrame(schema=schema)
    ops = np.asarray(op_pos[sel])
    launches = pl.DataFrame(
        {
            "op_idx": nodes["idx"].to_numpy()[ops],
            "aten_op_name": nodes["name"].to_numpy()[ops].astype(str),
            "aten_op_start": nodes["ts"].to_numpy()[ops],
            "tid": nodes["tid"].to_numpy()[sel],
            "launch_idx": nodes["idx"].to_numpy()[sel],
            "runtime_start": nodes["ts"].to_numpy()[sel],
        }
    )
    kernels = (
        trace.launch_links()
        .sort("gpu_ts", "gpu_idx")
        .unique("launch_idx", keep="first", maintain_order=True)
        .select(
            "launch_idx",
            "correlation",
            pl.col("gpu_name").alias("kernel_name"),
            pl.col("gpu_ts").alias("device_start"),
        )
    )
    return (
        launches.join(kernels, on="launch_idx", how="inner")
        .with_columns(
            (pl.col("runtime_start") - pl.col("aten_op_start")).alias("aten_op_delay"),
            (pl.col("device_start") - pl.col("runtime_start")).alias("runtime_delay"),
        )
        .select(list(schema))
        .cast(schema)  # type: ignore[arg-type]
    )


def aten_op_kernels_and_delay(trace: Trace, *, call_graph: CallGraph | None = None) -> pl.DataFrame:
    """Per ATen op name and kernel sequence: occurrences and mean delays (see module docstring)."""
    rows = aten_op_launches(trace, call_graph=call_graph)
    if rows.is_empty():
        return pl.DataFrame(schema=ATEN_OP_KERNELS_SCHEMA)
    per_op = (
        rows.sort("op_idx", "runtime_start", "launch_idx")
        .group_by("op_idx", maintain_order=True)
        .agg(
            pl.col("aten_op_name").first(),
            pl.col("kernel_name").str.join(" -> ").alias("kernel_sequence"),
            pl.col("aten_op_delay").first(),
            pl.col("runtime_delay").first(),
        )
    )
    return (
        per_op.group_by("aten_op_name", "kernel_sequence")
        .agg(
            pl.len().cast(pl.Int64).alias("occurrence_count"),
            (pl.col("aten_op_delay").mean() / 1000).round(3).alias("avg_aten_op_launch_delay"),
            (pl.col("runtime_delay").mean() / 1000).round(3).alias("avg_runtime_delay"),
        )
        .sort(["occurrence_count", "aten_op_name", "kernel_sequence"], descending=[True, False, False])
        .select(list(ATEN_OP_KERNELS_SCHEMA))
    )


def aten_op_kernels(traces: TraceInput) -> pl.DataFrame:
    """Registry entry: ``aten_op_kernels_and_delay`` per trace with a ``rank`` column."""
    schema = {"rank": pl.Int64(), **ATEN_OP_KERNELS_SCHEMA}
    return per_rank(traces, lambda t: aten_op_kernels_and_delay(t).with_columns(rank_lit(t)), schema)


register(
    AnalysisSpec(
        name="aten_op_kernels",
        func=aten_op_kernels,
        combine="concat",
        reads=CALL_GRAPH_READS,
        description="Kernels each ATen op launches, how often, and its mean op-to-launch and launch-to-kernel delays.",
        default=False,
        order=87,
        group="launch",
        empty_note="no kernel launch inside an aten:: op",
    )
)
