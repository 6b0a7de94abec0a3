"""Frequent CUDA kernel sequences (HTA ``get_frequent_cuda_kernel_sequences``, §1.12).

Definition, per trace (one rank):

* candidate roots are host events whose name **contains** ``operator_name`` (a literal
  substring, as in HTA);
* roots are the candidates at the smallest call-stack depth among candidates (HTA), or, with
  ``outermost=True``, every candidate with no candidate above it;
* a root needs at least ``min_pattern_len`` kernels (device events) in its subtree
  (``call_graph``: kernels hang under the runtime call that launched them);
* its pattern is ``root name | kernel names in ts order`` (joined with ``|``);
* per pattern: ``count`` (roots), ``GPU kernel duration (us)`` (sum of the roots' subtree kernel
  time) and ``CPU op duration (us)`` (sum of root durations); sorted by count (desc), then
  pattern.

All patterns are returned, like HTA; ``top_k`` only limits what the optional overlay marks.
The overlay (``output``) is a new trace file in which every event of a top-k occurrence gets
``args["Patterns"] = {pattern: count}``; with ``compress_other_kernels`` every other complete
event keeps no args and its name becomes a number, whose names are listed in the document's
``kinetoscopeSymbols`` map (HTA puts that map in the ``PyTorch Profiler`` span's args, which we
also do when the span exists).

Cost: one call-graph build (sort + stack sweep) and a few vectorised joins; HTA builds its own
call graph with a Python comparator sort, then re-reads the raw JSON and rewrites it row by row
(10.6 s on ``trace_diff/control``; it crashes on ``ns_resolution_trace``).
"""

from __future__ import annotations

import os

import numpy as np
import polars as pl

from kinetoscope.analysis._common import TraceInput, per_rank, rank_lit
from kinetoscope.analysis._raw import output_path, read_raw_trace, write_raw_trace
from kinetoscope.analysis.call_graph import CallGraph, build_call_graph
from kinetoscope.analysis.reads import CALL_GRAPH_READS
from kinetoscope.analysis.registry import AnalysisSpec, register
from kinetoscope.trace.model import Trace

FREQUENT_SEQUENCES_SCHEMA: dict[str, pl.DataType] = {
    "pattern": pl.String(),
    "count": pl.Int64(),
    "GPU kernel duration (us)": pl.Float64(),
    "CPU op duration (us)": pl.Float64(),
}


def _occurrences(
    cg: CallGraph, operator_name: str, min_pattern_len: int, outermost: bool
) -> tuple[pl.DataFrame, np.ndarray, np.ndarray]:
    """(roots with their pattern, root position per node (-1 if not in an occurrence), root
    positions)."""
    nodes = cg.nodes
    empty = pl.DataFrame(
        schema={"_pos": pl.Int64, "pattern": pl.String, "kernel_dur_sum": pl.Int64, "dur": pl.Int64}
    )
    if nodes.is_empty() or not operator_name:
        return empty, np.full(len(cg), -1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    cand = (~nodes["is_device"] & nodes["name"].str.contains(operator_name, literal=True)).to_numpy()
    if not cand.any():
        return empty, np.full(len(cg), -1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    depth = cg.depths
    if outermost:
        above = cg.nearest_ancestor(cand)
        roots = cand & (above < 0)
    else:
        roots = cand & (depth == depth[cand].min())
    roots &= nodes["num_kernels"].to_numpy() >= max(min_pattern_len, 1)
    root_pos = np.flatnonzero(roots)
    label = cg.subtree_label(root_pos)
    if not len(root_pos):
        return empty, label, root_pos
    dev = nodes["is_device"].to_numpy()
    kern = nodes.with_columns(pl.Series("_root", label)).filter(pl.Series(dev & (label >= 0)))
    seqs = (
        kern.sort("_root", "ts", "idx")
        .group_by("_root", maintain_order=True)
        .agg(pl.col("name").str.join("|").alias("_kernels"))
    )
    root_rows = (
        nodes.with_row_index("_pos")
        .with_columns(pl.col("_pos").cast(pl.Int64))
        .filter(pl.Series(roots))
        .join(seqs, left_on="_pos", right_on="_root", how="inner")
        .select(
            "_pos",
            pl.concat_str([pl.col("name"), pl.col("_kernels")], separator="|").alias("pattern"),
            "kernel_dur_sum",
            "dur",
        )
    )
    return root_rows, label, root_pos


def frequent_cuda_kernel_sequences(
    trace: Trace,
    operator_name: str,
    *,
    min_pattern_len: int = 3,
    top_k: int = 5,
    outermost: bool = False,
    output: str | os.PathLike[str] | None = None,
    compress_other_kernels: bool = True,
    call_graph: CallGraph | None = None,
) -> pl.DataFrame:
    """Kernel sequences launched under ops named like ``operator_name`` (see module docstring).

    Columns: ``pattern, count, GPU kernel duration (us), CPU op duration (us)``. With ``output``
    (a file path, or a directory for ``overlaid_<trace name>``) the top-k patterns are also
    written into a copy of the trace."""
    cg = call_graph or build_call_graph(trace)
    roots, label, _ = _occurrences(cg, operator_name, min_pattern_len, outermost)
    if roots.is_empty():
        return pl.DataFrame(schema=FREQUENT_SEQUENCES_SCHEMA)
    out = (
        roots.group_by("pattern")
        .agg(
            pl.len().cast(pl.Int64).alias("count"),
            (pl.col("kernel_dur_sum").sum() / 1000).alias("GPU kernel duration (us)"),
            (pl.col("dur").sum() / 1000).alias("CPU op duration (us)"),
        )
        .sort(["count", "pattern"], descending=[True, False])
        .cast(FREQUENT_SEQUENCES_SCHEMA)  # type: ignore[arg-type]
    )
    if output is not None:
        _overlay(trace, cg, roots, label, out.head(max(top_k, 0)), output, compress_other_kernels)
    return out


def _overlay(
    trace: Trace,
    cg: CallGraph,
    roots: pl.DataFrame,
    label: np.ndarray,
    top: pl.DataFrame,
    output: str | os.PathLike[str],
    compress: bool,
) -> str:
    out = output_path(output, trace.path, "overlaid_")
    doc, events = read_raw_trace(trace.path)
    counts = dict(zip(top["pattern"].to_list(), top["count"].to_list()))
    root_pattern = {
        int(p): pat for p, pat in zip(roots["_pos"].to_list(), roots["pattern"].to_list()) if pat in counts
    }
    marks: dict[int, dict[str, int]] = {}
    idx = cg.nodes["idx"].to_list()
    for pos, root in enumerate(label.tolist()):
        pat = root_pattern.get(root)
        if pat is not None:
            marks.setdefault(idx[pos], {})[pat] = counts[pat]
    symbols: dict[str, int] = {}
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            continue
        m = marks.get(i)
        if m is not None:
            args = ev.get("args")
            if not isinstance(args, dict):
                args = ev["args"] = {}
            args["Patterns"] = m
        elif compress and ev.get("ph") == "X" and ev.get("cat") != "Trace":
            ev["args"] = {}
            name = ev.get("name")
            if isinstance(name, str):
                ev["name"] = str(symbols.setdefault(name, len(symbols)))
    if compress:
        table = {str(v): k for k, v in symbols.items()}
        doc["kinetoscopeSymbols"] = table
        for ev in events:
            if (
                isinstance(ev, dict)
                and ev.get("cat") == "Trace"
                and str(ev.get("name", "")).startswith("PyTorch Profiler")
            ):
                ev.setdefault("args", {})
                if isinstance(ev["args"], dict):
                    ev["args"]["kinetoscopeSymbols"] = table
                break
    write_raw_trace(out, doc)
    return out


def frequent_sequences(
    traces: TraceInput,
    operator_name: str = "aten::",
    min_pattern_len: int = 3,
    outermost: bool = True,
) -> pl.DataFrame:
    """Registry entry: ``frequent_cuda_kernel_sequences`` per trace, with a ``rank`` column.
    Default: sequences under the outermost ``aten::`` ops."""

    def one_rank(t: Trace) -> pl.DataFrame | None:
        df = frequent_cuda_kernel_sequences(
            t, operator_name, min_pattern_len=min_pattern_len, outermost=outermost
        )
        return df.with_columns(rank_lit(t))

    schema = {"rank": pl.Int64(), **FREQUENT_SEQUENCES_SCHEMA}
    return per_rank(traces, one_rank, schema)


register(
    AnalysisSpec(
        name="frequent_kernel_sequences",
        func=frequent_sequences,
        combine="concat",
        reads=CALL_GRAPH_READS,
        description="Most frequent GPU kernel sequences launched by CPU ops whose name contains operator_name.",
        default=False,
        options={"operator_name": "aten::", "min_pattern_len": 3, "outermost": True},
        order=81,
        group="heavy",
        empty_note="no op matching operator_name launched at least min_pattern_len kernels",
    )
)
