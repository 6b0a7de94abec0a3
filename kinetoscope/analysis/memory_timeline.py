"""Memory over time: from ``[memory]`` events in a trace, or from a memory-timeline raw file.

From a trace (``profile_memory=True`` writes one ``[memory]`` instant event per allocation and
free, with ``Bytes`` (negative for a free), ``Total Allocated``, ``Total Reserved``, ``Device
Type`` and ``Device Id``):

* ``memory_timeline``: every memory event in time order: ``rank, device, ts(us), bytes,
  total_allocated, total_reserved`` (bytes; ``device`` is ``cpu``, ``cuda:N``, ... from the
  c10 device type);
* ``memory_summary``: per rank and device: number of allocations and frees, bytes allocated,
  peak allocated / reserved and when, allocated at the first and last event;
* ``memory_allocation_sites``: allocations grouped by the innermost host op enclosing them on
  the same thread (``call_graph`` nesting): count, bytes, largest allocation; "(no op)" when
  an allocation happens outside every op.

From the file ``torch.profiler`` writes with ``export_memory_timeline(path.raw.gz)`` (HTA
``MemoryAnalysis``, §1.21): rows ``[t, action, numbytes, category]`` (t in ns, -1 for
allocations that existed before profiling). ``memory_timeline_from_raw`` returns HTA's series:
one row per run of equal timestamps, with the cumulative bytes per category (Parameter,
Optimizer state, Input, Temporary, Activation, Gradient, Autograd, Unknown) after that run, and
pre-existing ``t < 0`` moved to the smallest positive time. ``memory_categories_summary`` gives
each category's peak and final size. HTA only plots this; both are vectorised here.
"""

from __future__ import annotations

import os

import numpy as np
import orjson
import polars as pl

from kinetoscope.analysis._common import TraceInput, per_rank, rank_lit
from kinetoscope.analysis._raw import read_raw_bytes
from kinetoscope.analysis.call_graph import build_call_graph
from kinetoscope.analysis.reads import MEMORY_READS, MEMORY_SITES_READS
from kinetoscope.analysis.registry import AnalysisSpec, register
from kinetoscope.trace.model import Trace

# c10::DeviceType values seen in Kineto memory events.
DEVICE_TYPES: dict[int, str] = {
    0: "cpu",
    1: "cuda",
    2: "mkldnn",
    3: "opengl",
    4: "opencl",
    5: "ideep",
    6: "hip",
    7: "fpga",
    8: "maia",
    9: "xla",
    10: "vulkan",
    11: "metal",
    12: "xpu",
    13: "mps",
    14: "meta",
    15: "hpu",
    16: "ve",
    17: "lazy",
    18: "ipu",
    19: "mtia",
    20: "privateuseone",
}

# export_memory_timeline categories, in torch's (and HTA's) index order.
MEMORY_CATEGORIES: tuple[str, ...] = (
    "Parameter",
    "Optimizer state",
    "Input",
    "Temporary",
    "Activation",
    "Gradient",
    "Autograd",
    "Unknown",
)

MEMORY_TIMELINE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "device": pl.String(),
    "ts(us)": pl.Float64(),
    "bytes": pl.Int64(),
    "total_allocated": pl.Int64(),
    "total_reserved": pl.Int64(),
}
MEMORY_SUMMARY_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "device": pl.String(),
    "num_allocs": pl.Int64(),
    "num_frees": pl.Int64(),
    "bytes_allocated": pl.Int64(),
    "bytes_freed": pl.Int64(),
    "peak_allocated": pl.Int64(),
    "peak_allocated_ts(us)": pl.Float64(),
    "peak_reserved": pl.Int64(),
    "start_allocated": pl.Int64(),
    "end_allocated": pl.Int64(),
}
ALLOCATION_SITES_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "device": pl.String(),
    "op": pl.String(),
    "num_allocs": pl.Int64(),
    "bytes_allocated": pl.Int64(),
    "max_alloc_bytes": pl.Int64(),
    "mean_alloc_bytes": pl.Float64(),
}


def _device_expr() -> pl.Expr:
    dt = pl.col("device_type")
    name = dt.replace_strict(DEVICE_TYPES, default=None, return_dtype=pl.String)
    name = pl.coalesce(name, pl.concat_str([pl.lit("device"), dt.cast(pl.String)]), pl.lit("unknown"))
    return (
        pl.when(pl.col("device_id").is_not_null() & (pl.col("device_id") >= 0) & (dt != 0))
        .then(pl.concat_str([name, pl.lit(":"), pl.col("device_id").cast(pl.String)]))
        .otherwise(name)
        .alias("device")
    )


def _memory_events(trace: Trace) -> pl.DataFrame:
    return trace.memory_events().with_columns(_device_expr()).sort("ts", "idx")


def memory_timeline(traces: TraceInput) -> pl.DataFrame:
    """Every ``[memory]`` event: ``rank, device, ts(us), bytes, total_allocated, total_reserved``."""

    def one_rank(t: Trace) -> pl.DataFrame | None:
        mem = _memory_events(t)
        return mem.select(
            rank_lit(t),
            "device",
            (pl.col("ts") / 1000).alias("ts(us)"),
            "bytes",
            "total_allocated",
            "total_reserved",
        )

    return per_rank(traces, one_rank, MEMORY_TIMELINE_SCHEMA)


def memory_summary(traces: TraceInput) -> pl.DataFrame:
    """Per rank and device: allocations, frees, peaks (bytes) and when the allocated peak was."""

    def one_rank(t: Trace) -> pl.DataFrame | None:
        mem = _memory_events(t)
        if mem.is_empty():
            return None
        return (
            mem.group_by("device", maintain_order=True)
            .agg(
                (pl.col("bytes") > 0).sum().cast(pl.Int64).alias("num_allocs"),
                (pl.col("bytes") < 0).sum().cast(pl.Int64).alias("num_frees"),
                pl.col("bytes").filter(pl.col("bytes") > 0).sum().alias("bytes_allocated"),
                (-pl.col("bytes").filter(pl.col("bytes") < 0).sum()).alias("bytes_freed"),
                pl.col("total_allocated").max().alias("peak_allocated"),
                (pl.col("ts").get(pl.col("total_allocated").arg_max()) / 1000).alias("peak_allocated_ts(us)"),
                pl.col("total_reserved").max().alias("peak_reserved"),
                pl.col("total_allocated").first().alias("start_allocated"),
                pl.col("total_allocated").last().alias("end_allocated"),
            )
            .with_columns(rank_lit(t))
            .sort("device")
        )

    return per_rank(traces, one_rank, MEMORY_SUMMARY_SCHEMA)


def allocation_sites(trace: Trace) -> pl.DataFrame:
    """Each allocation (``bytes > 0``) with the innermost host op enclosing it on its thread:
    columns ``idx, device, ts, bytes, op_idx, op`` (``op`` null when outside every op)."""
    mem = _memory_events(trace).filter(pl.col("bytes") > 0)
    if mem.is_empty():
        return mem.select("idx", "device", "ts", "bytes").with_columns(
            pl.lit(None, dtype=pl.Int64).alias("op_idx"), pl.lit(None, dtype=pl.String).alias("op")
        )
    cg = build_call_graph(trace, link_backward=False)
    host = cg.nodes.with_row_index("_pos").filter(~pl.col("is_device"))
    # the last host event (in nesting order) starting at or before each allocation, per thread
    ordered = host.with_columns(pl.col("_pos").cast(pl.Int64)).sort("pid", "tid", "ts", "depth")
    cand = mem.sort("ts").join_asof(
        ordered.select("pid", "tid", "ts", "_pos"),
        on="ts",
        by=["pid", "tid"],
        strategy="backward",
        check_sortedness=False,
    )
    pos = cand["_pos"].fill_null(-1).to_numpy().astype(np.int64)
    t = cand["ts"].to_numpy()
    starts = cg.nodes["ts"].to_numpy()
    ends = starts + np.maximum(cg.nodes["dur"].fill_null(0).to_numpy(), 0)
    parent = cg.parent_positions
    # climb until the op contains the allocation time
    active = np.flatnonzero(pos >= 0)
    while len(active):
        p = pos[active]
        inside = (starts[p] <= t[active]) & (t[active] <= ends[p])
        move = active[~inside]
        pos[move] = parent[pos[move]]
        active = move[pos[move] >= 0]
    names = cg.nodes["name"].to_numpy()
    idxs = cg.nodes["idx"].to_numpy()
    found = pos >= 0
    return cand.select("idx", "device", "ts", "bytes").with_columns(
        pl.when(pl.Series(found)).then(pl.Series(idxs[np.maximum(pos, 0)])).otherwise(None).alias("op_idx"),
        pl.when(pl.Series(found))
        .then(pl.Series(names[np.maximum(pos, 0)].astype(str)))
        .otherwise(None)
        .alias("op"),
    )


def memory_allocation_sites(traces: TraceInput, top_k: int = 20) -> pl.DataFrame:
    """Top ``top_k`` allocating ops per rank and device, by bytes allocated."""

    def one_rank(t: Trace) -> pl.DataFrame | None:
        sites = allocation_sites(t)
        if sites.is_empty():
            return None
        return (
            sites.with_columns(pl.col("op").fill_null("(no op)"))
            .group_by("device", "op")
            .agg(
                pl.len().cast(pl.Int64).alias("num_allocs"),
                pl.col("bytes").sum().alias("bytes_allocated"),
                pl.col("bytes").max().alias("max_alloc_bytes"),
                pl.col("bytes").mean().alias("mean_alloc_bytes"),
            )
            .sort(["device", "bytes_allocated", "op"], descending=[False, True, False])
            .group_by("device", maintain_order=True)
            .head(top_k)
            .with_columns(rank_lit(t))
        )

    return per_rank(traces, one_rank, ALLOCATION_SITES_SCHEMA)


# ---- export_memory_timeline raw files --------------------------------------------------------
def read_memory_timeline_raw(path: str | os.PathLike[str]) -> np.ndarray:
    """The rows of an ``export_memory_timeline`` ``.raw.gz`` / ``.raw.json`` file as an
    ``(n, 4)`` int64 array ``[t, action, numbytes, category]``."""
    data = orjson.loads(read_raw_bytes(path))
    if not isinstance(data, list):
        raise ValueError(
            f"{path}: not a memory timeline (expected a JSON array of [t, action, bytes, category])"
        )
    arr = np.asarray(data, dtype=np.int64)
    if arr.size == 0:
        return np.zeros((0, 4), dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != 4:
        raise ValueError(f"{path}: rows must be [t, action, numbytes, category]")
    return arr


def memory_timeline_from_raw(path: str | os.PathLike[str]) -> pl.DataFrame:
    """HTA ``MemoryAnalysis._process_raw_events``: ``time_ns`` then one column per category
    (cumulative bytes), one row per run of equal timestamps."""
    arr = read_memory_timeline_raw(path)
    schema = {"time_ns": pl.Int64(), **{c: pl.Int64() for c in MEMORY_CATEGORIES}}
    if not len(arr):
        return pl.DataFrame(schema=schema)
    t, nbytes, cat = arr[:, 0], arr[:, 2], arr[:, 3]
    ncat = len(MEMORY_CATEGORIES)
    if ((cat < 0) | (cat >= ncat)).any():
        raise ValueError(f"{path}: category index outside 0..{ncat - 1}")
    onehot = np.zeros((len(arr), ncat), dtype=np.int64)
    onehot[np.arange(len(arr)), cat] = nbytes
    sizes = np.cumsum(onehot, axis=0)
    last_of_run = np.flatnonzero(np.append(t[1:] != t[:-1], True))
    times = t[last_of_run]
    pos = t[t > 0]
    if len(pos):
        times = np.where(times < 0, pos.min(), times)
    cols = {"time_ns": times, **{c: sizes[last_of_run, i] for i, c in enumerate(MEMORY_CATEGORIES)}}
    return pl.DataFrame(cols, schema=schema)


def memory_categories_summary(path: str | os.PathLike[str]) -> pl.DataFrame:
    """Per category of a raw memory timeline: peak bytes, time of the peak, final bytes; plus a
    ``Total`` row (peak of the sum over categories)."""
    tl = memory_timeline_from_raw(path)
    schema = {
        "category": pl.String(),
        "peak_bytes": pl.Int64(),
        "peak_time_ns": pl.Int64(),
        "final_bytes": pl.Int64(),
    }
    if tl.is_empty():
        return pl.DataFrame(schema=schema)
    tl = tl.with_columns(pl.sum_horizontal(list(MEMORY_CATEGORIES)).alias("Total"))
    rows = []
    for c in (*MEMORY_CATEGORIES, "Total"):
        col = tl[c]
        i = int(col.arg_max())  # type: ignore[arg-type]
        rows.append(
            {
                "category": c,
                "peak_bytes": int(col[i]),
                "peak_time_ns": int(tl["time_ns"][i]),
                "final_bytes": int(col[-1]),
            }
        )
    return pl.DataFrame(rows, schema=schema)


_NO_MEMORY = "no memory events (record with profile_memory=True)"
register(
    AnalysisSpec(
        name="memory_summary",
        func=memory_summary,
        combine="concat",
        reads=MEMORY_READS,
        description="Memory per device from the memory events: allocations, frees, peak allocated/reserved and when.",
        default=False,
        needs_gpu=False,
        order=84,
        group="memory",
        empty_note=_NO_MEMORY,
    )
)
register(
    AnalysisSpec(
        name="memory_allocation_sites",
        func=memory_allocation_sites,
        combine="concat",
        reads=MEMORY_SITES_READS,
        description="Ops that allocate the most memory (innermost op enclosing each allocation).",
        default=False,
        needs_gpu=False,
        options={"top_k": 20},
        order=85,
        group="memory",
        empty_note=_NO_MEMORY,
    )
)
register(
    AnalysisSpec(
        name="memory_timeline",
        func=memory_timeline,
        combine="concat",
        reads=MEMORY_READS,
        description="Every memory event: bytes, total allocated and reserved over time, per device.",
        default=False,
        needs_gpu=False,
        order=86,
        group="memory",
        empty_note=_NO_MEMORY,
    )
)
