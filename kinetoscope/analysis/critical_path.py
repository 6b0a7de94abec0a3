"""Lightweight critical path analysis (HTA ``critical_path_analysis``, §1.16).

The graph has two nodes per event (start and end) for CPU ops, runtime/driver calls, data-loading
events and GPU work in the analysed window, and five edge kinds:

* ``critical_path_operator``: inside an op or kernel (start -> end) and between nested op
  boundaries on one CPU thread (weight = time between the two nodes);
* ``critical_path_dependency``: between consecutive top-level ops of a thread and for the CUDA
  runtime lock (``cudaLaunchKernel``/``cudaMemcpyAsync``/``cudaHostAlloc`` calls are serialised
  across threads in order of completion); weight 0;
* ``critical_path_kernel_launch_delay``: launch start -> kernel start, when the stream was idle
  (queue length 1 at the launch, 0 at the kernel) and the previous kernel on the stream had ended;
* ``critical_path_kernel_kernel_delay``: previous kernel end -> kernel start on a stream (gap
  below 1.5 ms);
* ``critical_path_sync_dependency`` (weight 0): last kernel on a stream -> end of
  ``cudaStreamSynchronize``; last kernel on every stream -> end of ``cudaDeviceSynchronize``;
  the kernel recorded before a ``cudaEventRecord`` -> end of ``cudaEventSynchronize``, or ->
  start of the next kernel launched on the stream that waits on it (``cudaStreamWaitEvent``).

The critical path is the longest path of this DAG. Every edge on it is attributed to an event
and classified (``bound_by``): ``cpu_bound``, ``data_loading``, ``gpu_compute_bound``,
``gpu_communication_bound``, ``gpu_kernel_kernel_overhead``, ``gpu_kernel_launch_overhead``, or
``""`` for zero-weight dependency/sync edges.

The construction follows HTA 0.6.1 step by step, including its node order and edge insertion
order, and the longest path breaks ties the way ``networkx.dag_longest_path`` does, so on the
HTA test traces the graph and the path are identical (see ``docs/analysis-heavy.md``). What it
does not copy: the whole-``Trace`` deepcopy, networkx and pandas row loops (everything here is
arrays plus one pass per stage), HTA's µs rounding (times stay in ns, weights are ns), and
some quirks listed in the docs (negative weights are clamped to 0 in the reported durations too;
an invalid same-stream sync edge is dropped with a warning instead of failing the analysis).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import polars as pl

from kinetoscope.analysis._common import TraceInput, per_rank, rank_lit
from kinetoscope.analysis._raw import output_path, read_raw_trace, write_raw_trace
from kinetoscope.analysis.kernel_types import COMMUNICATION_PATTERN
from kinetoscope.analysis.names import shorten_name
from kinetoscope.analysis.reads import CRITICAL_PATH_READS
from kinetoscope.analysis.registry import AnalysisSpec, register
from kinetoscope.trace.model import Trace

# Edge kinds (HTA ``CPEdgeType`` values).
OPERATOR_KERNEL = "critical_path_operator"
DEPENDENCY = "critical_path_dependency"
KERNEL_LAUNCH_DELAY = "critical_path_kernel_launch_delay"
KERNEL_KERNEL_DELAY = "critical_path_kernel_kernel_delay"
SYNC_DEPENDENCY = "critical_path_sync_dependency"
EDGE_TYPES = (OPERATOR_KERNEL, DEPENDENCY, KERNEL_LAUNCH_DELAY, KERNEL_KERNEL_DELAY, SYNC_DEPENDENCY)
_OPK, _DEP, _KLD, _KKD, _SYNC = range(5)

# ``bound_by`` categories.
GPU_KERNEL_KERNEL_OVERHEAD = "gpu_kernel_kernel_overhead"
GPU_KERNEL_LAUNCH_OVERHEAD = "gpu_kernel_launch_overhead"
DATA_LOADING = "data_loading"
CPU_BOUND = "cpu_bound"
GPU_COMPUTE_BOUND = "gpu_compute_bound"
GPU_COMMUNICATION_BOUND = "gpu_communication_bound"

DEFAULT_EDGE_TYPES_IN_OVERLAY = frozenset({DEPENDENCY, KERNEL_LAUNCH_DELAY, SYNC_DEPENDENCY})

BLOCKING_SYNC_CALLS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventQuery",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cudaMemcpyAsync",
    }
)
CUDA_RUNTIME_LOCK_EVENTS = frozenset({"cudaHostAlloc", "cudaLaunchKernel", "cudaMemcpyAsync"})
# HTA ``get_runtime_launch_events_mask``: calls that enqueue work on a stream.
RUNTIME_LAUNCH_NAMES = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cudaMemcpyAsync",
        "cudaMemsetAsync",
        "runFunction - job_prep_and_submit_for_execution",
        "hipLaunchKernel",
        "hipExtModuleLaunchKernel",
        "hipMemcpyAsync",
        "hipMemsetAsync",
        "hipMemcpyWithStream",
    }
)
# Gaps above this between consecutive kernels on a stream are not treated as kernel-kernel delay.
KERNEL_KERNEL_DELAY_THRESHOLD_NS = 1_500_000

_NODE_KINDS = ("cpu_op", "cuda_runtime", "cuda_driver")
_SYNC_NAMES = ("Event Sync", "Context Sync")
_COMM_RE = re.compile(COMMUNICATION_PATTERN)


class CriticalPathError(ValueError):
    """The requested window cannot be analysed (annotation missing, instance out of range...)."""


# ----------------------------------------------------------------------------------------------
# Trace view with HTA's column semantics
# ----------------------------------------------------------------------------------------------
def _hta_view(trace: Trace) -> pl.DataFrame:
    """Events as HTA's DataFrame sees them: ``hstream`` (-1 when absent), ``hcorr`` (-1 when
    absent) and ``index_correlation`` (partner idx > 0, 0 = has a correlation but no partner,
    -1 = none). The ``Trace`` span row is dropped like HTA does."""
    ev = (
        trace.events.filter(pl.col("kind") != "trace")
        .select(
            "idx",
            pl.col("kind").cast(pl.String),
            "name",
            "pid",
            "tid",
            "ts",
            "dur",
            pl.col("stream").fill_null(-1).alias("hstream"),
            pl.col("correlation").fill_null(-1).alias("hcorr"),
            pl.col("wait_on_stream").fill_null(-1),
            pl.col("wait_on_cuda_event_record_corr_id").fill_null(-1),
        )
        .sort("idx")
    )
    ev = ev.with_columns(pl.col("dur").fill_null(0), pl.col("pid").fill_null(-1), pl.col("tid").fill_null(-1))
    gpu_side = ((pl.col("hstream") >= 0) & (pl.col("hcorr") >= 0)) | pl.col("name").is_in(_SYNC_NAMES)
    with_corr = ev.filter(pl.col("hcorr") != -1).with_columns(gpu_side.alias("_gpu"))
    cpu = with_corr.filter(~pl.col("_gpu")).select("idx", "hcorr")
    gpu = with_corr.filter(pl.col("_gpu")).select("idx", "hcorr")
    pairs = cpu.join(gpu, on="hcorr", how="inner", suffix="_g")
    # with duplicate correlations HTA keeps the last partner (in file order)
    p_cpu = pairs.group_by("idx").agg(pl.col("idx_g").max().alias("_p"))
    p_gpu = pairs.group_by("idx_g").agg(pl.col("idx").max().alias("_p")).rename({"idx_g": "idx"})
    partner = pl.concat([p_cpu, p_gpu])
    ev = ev.join(partner, on="idx", how="left").with_columns(
        pl.coalesce(pl.col("_p"), pl.min_horizontal(pl.col("hcorr"), pl.lit(0))).alias("index_correlation")
    )
    return ev.drop("_p").sort("idx")


def _queue_lengths(full: pl.DataFrame) -> dict[int, int]:
    """HTA ``_get_queue_length_time_series_for_rank``: +1 at each launch call, -1 at each GPU op,
    cumulated per stream in time order. Returns event idx -> queue length after that event."""
    launches = full.filter(
        pl.col("name").is_in(list(RUNTIME_LAUNCH_NAMES)) & (pl.col("index_correlation") > 0)
    )
    gpu = full.filter(pl.col("hstream") != -1)
    rt = (
        launches.select("idx", "ts", "hcorr")
        .join(gpu.select("hcorr", pl.col("hstream").alias("stream")), on="hcorr", how="left")
        .select("idx", "ts", "stream", pl.lit(1).alias("q"), pl.lit(0).alias("_part"))
    )
    # equal timestamps: launch calls first, then GPU ops (HTA's concatenation order; its sort is
    # unstable on large traces, so HTA itself may order such ties either way)
    dev = gpu.filter(pl.col("hcorr").is_in(launches["hcorr"].implode())).select(
        "idx", "ts", pl.col("hstream").alias("stream"), pl.lit(-1).alias("q"), pl.lit(1).alias("_part")
    )
    merged = pl.concat([rt, dev]).filter(pl.col("stream").is_not_null())
    if merged.is_empty():
        return {}
    merged = merged.sort("ts", "_part", "idx", maintain_order=True).with_columns(
        pl.col("q").cum_sum().over("stream").alias("ql")
    )
    return dict(zip(merged["idx"].to_list(), merged["ql"].to_list()))


def _runtime_calls(full: pl.DataFrame) -> pl.DataFrame:
    """HTA ``_get_cuda_runtime_calls_df``: launch calls in time order with the stream and GPU of
    the work they enqueued, and a sequential ``launch_id``."""
    launches = full.filter(
        pl.col("name").is_in(list(RUNTIME_LAUNCH_NAMES)) & (pl.col("index_correlation") > 0)
    )
    gpu = full.filter((pl.col("hstream") != -1) & (pl.col("index_correlation") > 0)).select(
        pl.col("idx").alias("index_correlation"),
        pl.col("hstream").alias("stream_kernel"),
        pl.col("pid").alias("gpu_kernel"),
    )
    rc = launches.sort("ts", "idx", maintain_order=True).join(
        gpu, on="index_correlation", how="inner", maintain_order="left"
    )
    return rc.with_row_index("launch_id").with_columns(pl.col("launch_id").cast(pl.Int64))


def _event_record_previous_launch(full: pl.DataFrame, runtime_calls: pl.DataFrame) -> dict[int, int]:
    """HTA ``_get_cuda_event_record_df``: for each ``cudaEventRecord`` (by correlation) whose
    event is waited on, the last launch on the recorded stream/GPU at or before it."""
    records = full.filter(pl.col("name") == "cudaEventRecord")
    if records.is_empty():
        return {}
    waited = (
        full.filter(pl.col("wait_on_stream") > -1)
        .select(
            pl.col("wait_on_cuda_event_record_corr_id").alias("hcorr"),
            pl.col("wait_on_stream").alias("stream"),
            pl.col("pid").alias("gpu"),
        )
        .unique(maintain_order=True)
        .unique("hcorr", keep="first", maintain_order=True)
    )
    rec = records.select("ts", "hcorr", "idx").join(waited, on="hcorr", how="inner").sort("ts", "idx")
    if rec.is_empty():
        return {}
    launches = runtime_calls.select(
        "ts",
        pl.col("idx").alias("launch_idx"),
        "launch_id",
        pl.col("stream_kernel").alias("stream"),
        pl.col("gpu_kernel").alias("gpu"),
    ).sort("ts", "launch_id")
    out = rec.join_asof(launches, on="ts", by=["gpu", "stream"], strategy="backward", check_sortedness=False)
    return {
        int(c): int(li)
        for c, li in zip(out["hcorr"].to_list(), out["launch_idx"].to_list())
        if li is not None
    }


def _stream_wait_next_launch(full: pl.DataFrame, runtime_calls: pl.DataFrame) -> dict[int, int]:
    """HTA ``_get_cuda_stream_wait_event_df``: for each ``cudaStreamWaitEvent`` call (by idx),
    the next launch from the same thread onto the waiting stream (strictly later)."""
    names = set(full["name"].unique().to_list())
    if "cudaStreamWaitEvent" not in names or "Stream Wait Event" not in names:
        return {}
    gpu = full.filter((pl.col("hstream") != -1) & (pl.col("index_correlation") > 0)).select(
        pl.col("idx").alias("index_correlation"), pl.col("hstream").alias("stream")
    )
    swe = (
        full.filter((pl.col("name") == "cudaStreamWaitEvent") & (pl.col("index_correlation") > 0))
        .select("idx", "ts", "pid", "tid", "index_correlation")
        .join(gpu, on="index_correlation", how="inner")
        .sort("ts", "idx")
    )
    if swe.is_empty():
        return {}
    launches = runtime_calls.select(
        "ts",
        "pid",
        "tid",
        pl.col("stream_kernel").alias("stream"),
        pl.col("idx").alias("launch_idx"),
        "launch_id",
    ).sort("ts", "launch_id")
    out = swe.join_asof(
        launches,
        on="ts",
        by=["pid", "tid", "stream"],
        strategy="forward",
        allow_exact_matches=False,
        check_sortedness=False,
    )
    return {
        int(i): int(li) for i, li in zip(out["idx"].to_list(), out["launch_idx"].to_list()) if li is not None
    }


# ----------------------------------------------------------------------------------------------
# Result
# ----------------------------------------------------------------------------------------------
@dataclass
class CriticalPath:
    """A critical path graph for one rank and window, with its longest path.

    Nodes are numbered by ``(ts, event idx)`` (start before end). Edges are kept in insertion
    order. Times and weights are in ns.
    """

    trace: Trace
    window: tuple[int, int]
    events: pl.DataFrame  # clipped events (HTA view) used to build the graph
    node_ev: np.ndarray
    node_ts: np.ndarray
    node_is_start: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_type: np.ndarray  # codes into EDGE_TYPES
    edge_weight: np.ndarray
    edge_attr: np.ndarray  # attributed event idx, or -1
    path_nodes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    path_edges: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    success: bool = False
    data_load_events: tuple[str, ...] = ()
    warnings: list[str] = field(default_factory=list)

    # ---- sizes -------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self.node_ev)

    @property
    def num_edges(self) -> int:
        return len(self.edge_src)

    @property
    def num_graph_nodes(self) -> int:
        """Nodes that have at least one edge (what ``len(networkx graph)`` counts in HTA)."""
        if not self.num_edges:
            return 0
        return int(len(np.union1d(self.edge_src, self.edge_dst)))

    @property
    def length_ns(self) -> int:
        return int(self.edge_weight[self.path_edges].sum()) if len(self.path_edges) else 0

    @property
    def critical_events(self) -> set[int]:
        """Event idx values on the critical path (HTA ``critical_path_events_set``)."""
        return set(self.node_ev[self.path_nodes].tolist())

    def nodes_for_event(self, idx: int) -> tuple[int | None, int | None]:
        """(start node, end node) ids of event ``idx``."""
        hits = np.flatnonzero(self.node_ev == idx)
        s = e = None
        for h in hits.tolist():
            if self.node_is_start[h]:
                s = h
            else:
                e = h
        return s, e

    def edge(self, src: int, dst: int) -> dict[str, Any] | None:
        hit = np.flatnonzero((self.edge_src == src) & (self.edge_dst == dst))
        if not len(hit):
            return None
        i = int(hit[0])
        return {
            "src": src,
            "dst": dst,
            "type": EDGE_TYPES[int(self.edge_type[i])],
            "weight": int(self.edge_weight[i]),
            "event_idx": int(self.edge_attr[i]) if self.edge_attr[i] >= 0 else None,
        }

    # ---- tables ------------------------------------------------------------------------
    def edges_table(self) -> pl.DataFrame:
        on_path = np.zeros(self.num_edges, dtype=bool)
        on_path[self.path_edges] = True
        return pl.DataFrame(
            {
                "src": self.edge_src,
                "dst": self.edge_dst,
                "type": pl.Series([EDGE_TYPES[c] for c in self.edge_type.tolist()], dtype=pl.String),
                "weight_ns": self.edge_weight,
                "event_idx": pl.Series(self.edge_attr).replace(-1, None),
                "critical": on_path,
            },
            schema_overrides={"src": pl.Int64, "dst": pl.Int64, "weight_ns": pl.Int64, "event_idx": pl.Int64},
        )

    @staticmethod
    def breakdown_schema() -> dict[str, pl.DataType]:
        return {
            "event_idx": pl.Int64(),
            "duration": pl.Float64(),
            "duration_ns": pl.Int64(),
            "type": pl.String(),
            "name": pl.String(),
            "s_name": pl.String(),
            "cat": pl.String(),
            "pid": pl.Int64(),
            "tid": pl.Int64(),
            "stream": pl.Int64(),
            "bound_by": pl.String(),
        }

    def breakdown(self) -> pl.DataFrame:
        """One row per edge on the critical path, in path order (HTA
        ``get_critical_path_breakdown``; ``duration`` in µs, plus ``duration_ns``)."""
        cols = self.breakdown_schema()
        if not len(self.path_edges):
            return pl.DataFrame(schema=cols)
        pe = self.path_edges
        attr = self.edge_attr[pe]
        base = pl.DataFrame(
            {
                "_order": np.arange(len(pe)),
                "event_idx": pl.Series(attr).replace(-1, None),
                "duration_ns": self.edge_weight[pe],
                "type": [EDGE_TYPES[c] for c in self.edge_type[pe].tolist()],
            },
            schema_overrides={"event_idx": pl.Int64, "duration_ns": pl.Int64},
        )
        info = self.trace.events.select(
            pl.col("idx").alias("event_idx"), "name", "cat", "pid", "tid", "stream"
        )
        df = base.join(info, on="event_idx", how="left").sort("_order")
        patterns = list(self.data_load_events)
        names = df["name"].to_list()
        s_names = [shorten_name(n) if n is not None else None for n in names]
        bound = []
        for typ, sname, stream in zip(df["type"].to_list(), s_names, df["stream"].to_list()):
            if typ == KERNEL_KERNEL_DELAY:
                bound.append(GPU_KERNEL_KERNEL_OVERHEAD)
            elif typ == KERNEL_LAUNCH_DELAY:
                bound.append(GPU_KERNEL_LAUNCH_OVERHEAD)
            elif typ in (DEPENDENCY, SYNC_DEPENDENCY):
                bound.append("")
            elif sname is None:
                bound.append("")
            elif stream is None or stream < 0:
                if patterns and any(re.search(p, sname) for p in patterns):
                    bound.append(DATA_LOADING)
                else:
                    bound.append(CPU_BOUND)
            elif _COMM_RE.search(sname):
                bound.append(GPU_COMMUNICATION_BOUND)
            else:
                bound.append(GPU_COMPUTE_BOUND)
        return df.with_columns(
            (pl.col("duration_ns") / 1000).alias("duration"),
            pl.Series("s_name", s_names, dtype=pl.String),
            pl.Series("bound_by", bound, dtype=pl.String),
        ).select(list(cols))

    def summary(self) -> pl.DataFrame:
        """Share of the critical path per ``bound_by`` (HTA ``summary()``): columns
        ``bound_by, duration (us), percentage``; ``""`` holds the zero-weight dependency and
        synchronisation edges."""
        bd = self.breakdown()
        schema = {"bound_by": pl.String, "duration (us)": pl.Float64, "percentage": pl.Float64}
        if bd.is_empty():
            return pl.DataFrame(schema=schema)
        total = bd["duration_ns"].sum()
        return (
            bd.group_by("bound_by")
            .agg((pl.col("duration_ns").sum()).alias("_ns"))
            .with_columns(
                (pl.col("_ns") / 1000).alias("duration (us)"),
                (pl.col("_ns") * 100.0 / total if total else pl.lit(0.0)).alias("percentage"),
            )
            .sort("bound_by")
            .select(list(schema))
        )

    # ---- overlay -----------------------------------------------------------------------
    def overlay(
        self,
        output: str | os.PathLike[str],
        *,
        only_show_critical_events: bool = True,
        show_all_edges: bool = False,
        edge_types: Iterable[str] | None = None,
        show_zero_weight_launch_edges: bool = False,
    ) -> str:
        """Write a copy of the trace with the critical path marked (HTA
        ``overlay_critical_path_analysis``): ``args.critical = 1`` on critical events and Chrome
        flow events (``cat``/``name`` ``critical_path``) for critical edges of ``edge_types``
        (default: dependency, launch delay, sync), or for every edge with ``show_all_edges``.
        ``output`` is a file path (``.gz`` means gzip) or an existing directory, where the file
        is named ``overlaid_critical_path_<trace file name>``. The input is never modified."""
        out = output_path(output, self.trace.path, "overlaid_critical_path_")
        doc, events = read_raw_trace(self.trace.path)
        if only_show_critical_events:
            show_all_edges = False
        types = set(edge_types) if edge_types is not None else set(DEFAULT_EDGE_TYPES_IN_OVERLAY)
        critical = self.critical_events
        for i in critical:
            ev = events[i]
            if isinstance(ev, dict):
                args = ev.get("args")
                if not isinstance(args, dict):
                    args = ev["args"] = {}
                args["critical"] = 1
        on_path = np.zeros(self.num_edges, dtype=bool)
        on_path[self.path_edges] = True
        if show_all_edges:
            chosen = [
                i
                for i in range(self.num_edges)
                if show_zero_weight_launch_edges
                or not (self.edge_type[i] == _KLD and self.edge_weight[i] == 0)
            ]
        else:
            chosen = [int(i) for i in self.path_edges if EDGE_TYPES[int(self.edge_type[i])] in types]
        flows = []
        for flow_id, i in enumerate(chosen):
            typ = EDGE_TYPES[int(self.edge_type[i])]
            args = {
                "weight": int(round(int(self.edge_weight[i]) / 1000)),
                "critical": bool(on_path[i]),
                "type": typ,
            }
            for node, ph in ((int(self.edge_src[i]), "s"), (int(self.edge_dst[i]), "f")):
                ev = events[int(self.node_ev[node])]
                ts = ev["ts"]
                if not self.node_is_start[node]:
                    dur = ev.get("dur", 0)
                    ts = ts + dur
                    dev = (ev.get("args") or {}).get("device", -1)
                    if isinstance(dev, int) and dev >= 0:
                        ts -= min(1, dur)
                flow = {
                    "ph": ph,
                    "id": flow_id,
                    "pid": ev.get("pid"),
                    "tid": ev.get("tid"),
                    "ts": int(ts),
                    "cat": "critical_path",
                    "name": "critical_path",
                    "args": args,
                }
                if ph == "f":
                    flow["bp"] = "e"
                flows.append(flow)
        if only_show_critical_events:
            kept = [
                ev
                for ev in events
                if not isinstance(ev, dict)
                or ev.get("ph") != "X"
                or ev.get("cat", "") in ("user_annotation", "python_function")
                or (isinstance(ev.get("args"), dict) and ev["args"].get("critical", 0) == 1)
            ]
        else:
            kept = events
        doc["traceEvents"] = kept + flows
        write_raw_trace(out, doc)
        return out


# ----------------------------------------------------------------------------------------------
# Construction
# ----------------------------------------------------------------------------------------------
class _Edges:
    """Append-only edge log with networkx ``add_edge`` semantics, resolved in ``finish``:
    re-adding (u, v) keeps the edge's first position but takes the last type and weight; the
    last attribution of (u, v) wins."""

    def __init__(self, n_nodes: int) -> None:
        self.k = n_nodes + 1
        self.u: list[int] = []
        self.v: list[int] = []
        self.t: list[int] = []
        self.z: list[bool] = []
        self.akey: list[int] = []
        self.aev: list[int] = []

    def add(self, u: int, v: int, typ: int, zero_weight: bool = False) -> None:
        self.u.append(u)
        self.v.append(v)
        self.t.append(typ)
        self.z.append(zero_weight)

    def finish(self, node_ts: np.ndarray) -> tuple[np.ndarray, ...]:
        """(src, dst, type, weight, attributed event) arrays in first-insertion order."""
        u = np.asarray(self.u, dtype=np.int64)
        v = np.asarray(self.v, dtype=np.int64)
        t = np.asarray(self.t, dtype=np.int8)
        z = np.asarray(self.z, dtype=bool)
        if not len(u):
            e = np.zeros(0, dtype=np.int64)
            return e, e, e.astype(np.int8), e, e
        key = u * self.k + v
        order = np.argsort(key, kind="stable")
        ks = key[order]
        first_of_group = np.ones(len(ks), dtype=bool)
        first_of_group[1:] = ks[1:] != ks[:-1]
        starts = np.flatnonzero(first_of_group)
        ends = np.append(starts[1:], len(ks)) - 1
        first = order[starts]
        lastp = order[ends]
        pos = np.argsort(first, kind="stable")  # unique edges in insertion order
        first, lastp, gkeys = first[pos], lastp[pos], ks[starts][pos]
        src, dst = u[first], v[first]
        typ, zero = t[lastp], z[lastp]
        w = np.where(zero | (typ == _DEP) | (typ == _SYNC), 0, node_ts[dst] - node_ts[src])
        attr = np.full(len(src), -1, dtype=np.int64)
        if self.akey:
            ak = np.asarray(self.akey, dtype=np.int64)
            av = np.asarray(self.aev, dtype=np.int64)
            korder = np.argsort(gkeys)
            hit = korder[np.searchsorted(gkeys[korder], ak)]
            attr[hit] = av  # later assignments overwrite earlier ones
        return src, dst, typ, w.astype(np.int64), attr


def _window(
    view: pl.DataFrame, annotation: str | None, instance_id: int | tuple[int, int] | None
) -> tuple[int, int]:
    if not annotation:
        end = view.select((pl.col("ts") + pl.col("dur")).max()).item()
        return int(cast(int, view["ts"].min())), int(end)
    if instance_id is None:
        a, b = 0, 0
    elif isinstance(instance_id, tuple):
        a, b = int(instance_id[0]), int(instance_id[1])
    else:
        a = b = int(instance_id)
    anns = view.filter(
        (pl.col("hstream") == -1) & pl.col("name").str.contains(annotation, literal=True)
    ).sort("ts", "idx")
    if anns.is_empty():
        raise CriticalPathError(f"annotation {annotation!r} not found in the trace")
    if a < 0 or b < a or a >= anns.height:
        raise CriticalPathError(
            f"instance {instance_id!r} out of range: {anns.height} instance(s) of {annotation!r}"
        )
    sel = anns[a : b + 1]
    return int(cast(int, sel["ts"].min())), int(cast(int, (sel["ts"] + sel["dur"]).max()))


def critical_path(
    trace: Trace,
    annotation: str | None = "ProfilerStep",
    instance_id: int | tuple[int, int] | None = 0,
    *,
    data_load_events: Sequence[str] | None = None,
    add_zero_weight_launch_edges: bool = False,
) -> CriticalPath:
    """Build the critical path graph for one trace (one rank) and compute its longest path.

    ``annotation`` selects the window: the ``instance_id``-th host event whose name contains it
    (in time order; a ``(first, last)`` tuple spans several instances); ``None`` or ``""``
    analyses the whole trace. ``data_load_events`` are name substrings of data-loading events
    (kept as nodes and reported as ``data_loading``). ``add_zero_weight_launch_edges`` adds a
    0-weight launch -> kernel edge for every kernel (HTA's
    ``CRITICAL_PATH_ADD_ZERO_WEIGHT_LAUNCH_EDGE=1``).
    """
    full = _hta_view(trace)
    warnings: list[str] = []
    if full.is_empty():
        raise CriticalPathError("the trace has no complete events")
    if not (full["kind"] == "cuda_sync").any():
        warnings.append(
            "trace has no CUDA synchronization events (cuda_sync); GPU->CPU dependencies are missing"
        )
    start, end = _window(full, annotation, instance_id)
    dl = tuple(data_load_events or ())
    clipped = _clip_window(full, start, end)
    nodes = _Nodes.of(full, clipped, dl)
    E = _Edges(nodes.n)
    attribute = _attributor(E, nodes.ev_list, nodes.st_list)
    _lock_edges(E, nodes, attribute)
    _call_stack_edges(E, clipped, nodes)
    _kernel_edges(
        full,
        clipped,
        nodes.start_node,
        nodes.end_node,
        E,
        nodes.ts.tolist(),
        attribute,
        add_zero_weight_launch_edges,
        warnings,
    )
    src, dst, typ, w, attr = _valid_edges(E, nodes, clipped, warnings)
    cp = CriticalPath(
        trace=trace,
        window=(start, end),
        events=clipped,
        node_ev=nodes.ev,
        node_ts=nodes.ts,
        node_is_start=nodes.is_start,
        edge_src=src,
        edge_dst=dst,
        edge_type=typ,
        edge_weight=w,
        edge_attr=attr,
        data_load_events=dl,
        warnings=warnings,
    )
    _solve(cp, nodes.n, E.k)
    return cp


def _clip_window(full: pl.DataFrame, start: int, end: int) -> pl.DataFrame:
    """The events of the window (HTA ``critical_path_analysis``'s clip): CPU events that start
    in it with a positive duration, and GPU events whose runtime call does (plus every
    ``Stream Wait Event``), in ``idx`` order."""
    cpu_in = (pl.col("hstream") == -1) & pl.col("ts").is_between(start, end) & (pl.col("dur") > 0)
    runtime = full.filter(pl.col("hstream") == -1).select(
        pl.col("idx").alias("index_correlation"), pl.col("ts").alias("_rts"), pl.col("dur").alias("_rdur")
    )
    gpu = (
        full.filter(pl.col("hstream") != -1)
        .join(runtime, on="index_correlation", how="left")
        .filter(
            (pl.col("_rts").is_between(start, end) & (pl.col("_rdur") > 0)).fill_null(False)
            | (pl.col("name") == "Stream Wait Event")
        )
        .drop("_rts", "_rdur")
    )
    return pl.concat([full.filter(cpu_in), gpu]).sort("idx")


@dataclass
class _Nodes:
    """The graph's nodes: a start and an end node per node event, numbered by ``(ts, idx)``
    (start before end), with dense event idx -> node id lists (-1: the event has no node) and
    per-event flags, as plain lists where the edge loops read them (speed)."""

    ev: np.ndarray  # node -> event idx
    ts: np.ndarray  # node -> time (ns)
    is_start: np.ndarray  # node -> start (True) or end node
    start_node: list[int]  # event idx -> start node
    end_node: list[int]  # event idx -> end node
    lock_ev: np.ndarray  # event idx -> CUDA runtime lock event
    lock_node: list[bool]  # node -> its event is a lock event
    is_blocking: list[bool]  # event idx -> blocking synchronisation call
    ev_list: list[int]  # ``ev`` as a list
    st_list: list[bool]  # ``is_start`` as a list

    @property
    def n(self) -> int:
        return len(self.ev)

    @classmethod
    def of(cls, full: pl.DataFrame, clipped: pl.DataFrame, dl: tuple[str, ...]) -> _Nodes:
        is_node = pl.col("kind").is_in(_NODE_KINDS) | (
            (pl.col("hstream") != -1) & (pl.col("index_correlation") >= 0)
        )
        if dl:
            is_node = is_node | pl.col("name").str.contains("|".join(re.escape(p) for p in dl))
        node_events = clipped.filter(is_node)
        ev_idx = node_events["idx"].to_numpy().astype(np.int64)
        ev_ts = node_events["ts"].to_numpy().astype(np.int64)
        ev_end = ev_ts + node_events["dur"].to_numpy().astype(np.int64)
        m = len(ev_idx)
        all_ev = np.concatenate([ev_idx, ev_idx])
        all_ts = np.concatenate([ev_ts, ev_end])
        all_start = np.concatenate([np.ones(m, dtype=bool), np.zeros(m, dtype=bool)])
        order = np.lexsort((all_ev, all_ts))  # stable: start before end for zero-length events
        node_ev = all_ev[order]
        node_is_start = all_start[order]
        # event idx -> start/end node id (-1 when the event has no nodes), dense for speed
        size = int(cast(int, full["idx"].max())) + 2
        start_arr = np.full(size, -1, dtype=np.int64)
        end_arr = np.full(size, -1, dtype=np.int64)
        nids = np.arange(len(node_ev), dtype=np.int64)
        start_arr[node_ev[node_is_start]] = nids[node_is_start]
        end_arr[node_ev[~node_is_start]] = nids[~node_is_start]
        ev_name = node_events["name"]
        lock_ev = np.zeros(size, dtype=bool)
        lock_ev[ev_idx[ev_name.is_in(list(CUDA_RUNTIME_LOCK_EVENTS)).to_numpy()]] = True
        blocking_ev = np.zeros(size, dtype=bool)
        blocking_ev[ev_idx[ev_name.is_in(list(BLOCKING_SYNC_CALLS)).to_numpy()]] = True
        return cls(
            ev=node_ev,
            ts=all_ts[order],
            is_start=node_is_start,
            start_node=start_arr.tolist(),
            end_node=end_arr.tolist(),
            lock_ev=lock_ev,
            lock_node=lock_ev[node_ev].tolist(),
            is_blocking=blocking_ev.tolist(),
            ev_list=node_ev.tolist(),
            st_list=node_is_start.tolist(),
        )


def _attributor(
    E: _Edges, ev_list: list[int], st_list: list[bool]
) -> Callable[[int, int, int, int | None], None]:
    """HTA ``_attribute_edge`` over these nodes: which event an operator / kernel-kernel edge
    belongs to (recorded in ``E``)."""
    K = E.k
    akey = E.akey
    aev = E.aev

    def attribute(u: int, v: int, typ: int, parent: int | None) -> None:
        if typ == _KKD:
            ev = ev_list[u]
        elif typ != _OPK:
            return
        elif st_list[u]:
            ev = ev_list[u]
        elif not st_list[v]:
            ev = ev_list[v]
        else:
            ev = -1 if parent is None else parent
        akey.append(u * K + v)
        aev.append(ev)

    return attribute


def _lock_edges(E: _Edges, nodes: _Nodes, attribute: Callable[[int, int, int, int | None], None]) -> None:
    """CUDA runtime lock edges: each lock event's end node after the pending starts."""
    ev_list, st_list = nodes.ev_list, nodes.st_list
    pending: list[int] = []
    last: int | None = None
    for nid in np.flatnonzero(nodes.lock_ev[nodes.ev]).tolist():
        e = ev_list[nid]
        if st_list[nid]:
            pending.append(nid)
        else:
            while pending:
                prev = pending.pop()
                if ev_list[prev] == e:
                    E.add(prev, nid, _OPK)
                    attribute(prev, nid, _OPK, e)
                else:
                    E.add(prev, nid, _DEP)
            if last is not None and not st_list[last]:
                E.add(last, nid, _DEP)
        last = nid


def _stack_rows(clipped: pl.DataFrame) -> pl.DataFrame:
    """The CPU events HTA builds call stacks from: the backward thread folded into the forward
    one, without the (pid, tid) pairs that also hold GPU rows (GPU "threads" for HTA)."""
    cpu_rows = clipped.filter(pl.col("hstream") == -1)
    fwd = _single_tid(cpu_rows, "forward")
    bwd = _single_tid(cpu_rows, "autograd")
    if fwd is not None and bwd is not None and fwd != bwd:
        cpu_rows = cpu_rows.with_columns(
            pl.when(pl.col("tid") == bwd).then(fwd).otherwise(pl.col("tid")).alias("tid")
        )
        gpu_keys_tid = pl.when(pl.col("tid") == bwd).then(fwd).otherwise(pl.col("tid"))
    else:
        gpu_keys_tid = pl.col("tid")
    gpu_threads = clipped.filter(pl.col("hstream") != -1).select("pid", gpu_keys_tid.alias("tid")).unique()
    return cpu_rows.join(gpu_threads, on=["pid", "tid"], how="anti")


def _stack_boundaries(cpu_rows: pl.DataFrame) -> tuple[list[int], list[int], list[bool]]:
    """(thread group, event idx, is start) of every start and end of the CPU events, in HTA's
    ``compare_events`` order: start key (ts, 1, -dur, idx); end key (end, 0, dur, -idx)."""
    c_idx = cpu_rows["idx"].to_numpy().astype(np.int64)
    c_ts = cpu_rows["ts"].to_numpy().astype(np.int64)
    c_dur = np.maximum(cpu_rows["dur"].to_numpy().astype(np.int64), 0)
    g = cpu_rows.select(pl.struct("pid", "tid").rank("dense"))[:, 0].to_numpy().astype(np.int64)
    n = len(c_idx)
    b_g = np.concatenate([g, g])
    b_t = np.concatenate([c_ts, c_ts + c_dur])
    b_type = np.concatenate([np.ones(n, dtype=np.int64), np.zeros(n, dtype=np.int64)])
    b_k3 = np.concatenate([-c_dur, c_dur])
    b_k4 = np.concatenate([c_idx, -c_idx])
    b_ev = np.concatenate([c_idx, c_idx])
    border = np.lexsort((b_k4, b_k3, b_type, b_t, b_g))
    return b_g[border].tolist(), b_ev[border].tolist(), (b_type[border] == 1).tolist()


def _call_stack_edges(E: _Edges, clipped: pl.DataFrame, nodes: _Nodes) -> None:
    """Call stack edges (HTA ``call_stack.CallGraph`` + DFS): a walk over each thread's event
    boundaries linking each node to the previous one, operator edges inside a stack and
    dependency edges between top-level events."""
    cpu_rows = _stack_rows(clipped)
    if cpu_rows.is_empty():
        return
    bg, bev, bstart = _stack_boundaries(cpu_rows)
    start_node, end_node, lock_node = nodes.start_node, nodes.end_node, nodes.lock_node
    ev_list, st_list, is_blocking = nodes.ev_list, nodes.st_list, nodes.is_blocking
    K = E.k
    stack: list[int] = []
    parent_of: dict[int, int] = {}
    last_node: int | None = None
    last_parent: int | None = None
    depth = 0
    cur_g = None
    # E.add / attribute inlined: this loop runs twice per CPU event
    eu, ev_, et, ez = E.u.append, E.v.append, E.t.append, E.z.append
    ak, ae = E.akey.append, E.aev.append
    for gg, e, is_start in zip(bg, bev, bstart):
        if gg != cur_g:
            cur_g, stack, last_node, last_parent, depth = gg, [], None, None, 0
        if is_start:
            par = stack[-1] if stack else -1
            parent_of[e] = par
            stack.append(e)
            s = start_node[e]
            if s < 0:
                continue
            # HTA skips pairs of runtime-lock nodes unless they are (end, start)
            if last_node is not None and (
                not (lock_node[last_node] and lock_node[s]) or not st_list[last_node]
            ):
                eu(last_node)
                ev_(s)
                ez(False)
                if depth == 0:
                    et(_DEP)
                else:
                    et(_OPK)
                    ak(last_node * K + s)
                    ae(ev_list[last_node] if st_list[last_node] else cast(int, last_parent))
            last_node, last_parent = s, par
            depth += 1
        elif stack:
            e = stack.pop()
            par = parent_of[e]
            en = end_node[e]
            if en < 0:
                continue
            if last_node is not None and not (lock_node[last_node] and lock_node[en]):  # (x, end)
                eu(last_node)
                ev_(en)
                et(_OPK)
                ez(is_blocking[e])
                ak(last_node * K + en)
                ae(ev_list[last_node] if st_list[last_node] else ev_list[en])
            last_node, last_parent = en, par
            depth -= 1


def _valid_edges(
    E: _Edges, nodes: _Nodes, clipped: pl.DataFrame, warnings: list[str]
) -> tuple[np.ndarray, ...]:
    """(src, dst, type, weight, attributed event) of the graph: negative weights set to 0, and
    synchronisation edges between two GPU ops on the same stream dropped (HTA fails the
    analysis on them)."""
    src, dst, typ, w, attr = E.finish(nodes.ts)
    neg = w < 0
    if neg.any():
        warnings.append(f"{int(neg.sum())} edge(s) with negative weight set to 0 (child ends after parent)")
        w = np.where(neg, 0, w)
    if not (typ == _SYNC).any():
        return src, dst, typ, w, attr
    stream_of = dict(zip(clipped["idx"].to_list(), clipped["hstream"].to_list()))
    ss = np.array([stream_of.get(e, -1) for e in nodes.ev[src].tolist()]) if len(src) else np.zeros(0)
    sd = np.array([stream_of.get(e, -1) for e in nodes.ev[dst].tolist()]) if len(src) else np.zeros(0)
    bad = (typ == _SYNC) & (ss != -1) & (ss == sd)
    if bad.any():
        warnings.append(f"dropped {int(bad.sum())} synchronisation edge(s) between ops on the same stream")
        keep = ~bad
        src, dst, typ, w, attr = src[keep], dst[keep], typ[keep], w[keep], attr[keep]
    return src, dst, typ, w, attr


def _solve(cp: CriticalPath, n_nodes: int, K: int) -> None:
    """The longest path of ``cp``'s graph, its edges, and ``success`` (a path of 2+ nodes)."""
    src, dst = cp.edge_src, cp.edge_dst
    path = _dag_longest_path(n_nodes, src, dst, cp.edge_weight)
    if path is None:
        cp.warnings.append("the graph has a cycle; no critical path")
        return
    cp.path_nodes = path
    if len(path) >= 2:
        ekey = src * K + dst
        eorder = np.argsort(ekey, kind="stable")
        want = path[:-1] * K + path[1:]
        cp.path_edges = eorder[np.searchsorted(ekey[eorder], want)]
    cp.success = len(path) >= 2


def _single_tid(cpu_rows: pl.DataFrame, needle: str) -> int | None:
    tids = (
        cpu_rows.filter(
            pl.col("kind").is_in(["cpu_op", "user_annotation"])
            & pl.col("name").str.contains(needle, literal=True)
        )["tid"]
        .unique()
        .to_list()
    )
    return int(tids[0]) if len(tids) == 1 else None


def _at(nodes: list[int], e: int | None) -> int | None:
    """Node id of event ``e`` in a dense event->node list, or None."""
    if e is None or e < 0 or e >= len(nodes):
        return None
    v = nodes[e]
    return v if v >= 0 else None


def _kernel_edges(
    full: pl.DataFrame,
    clipped: pl.DataFrame,
    start_node: Any,
    end_node: Any,
    E: _Edges,
    E_ts: list[int],
    attribute: Callable[[int, int, int, int | None], None],
    zero_launch: bool,
    warnings: list[str],
) -> None:
    """Kernel, launch, kernel-kernel and synchronisation edges (HTA ``_construct_graph_from_kernels``),
    walking the GPU ops and synchronisation calls in time order."""
    rc = _runtime_calls(full)
    walk = _KernelWalk(
        E=E,
        start_node=start_node,
        end_node=end_node,
        node_ts=E_ts,
        attribute=attribute,
        zero_launch=zero_launch,
        warnings=warnings,
        ql=_queue_lengths(full),
        prev_launch=_event_record_previous_launch(full, rc),
        next_launch=_stream_wait_next_launch(full, rc),
        full_ts=dict(zip(full["idx"].to_list(), full["ts"].to_list())),
        full_ic=dict(zip(full["idx"].to_list(), full["index_correlation"].to_list())),
    )
    rows = (
        clipped.filter(
            ((pl.col("hstream") != -1) | pl.col("name").is_in(_SYNC_NAMES))
            & (pl.col("index_correlation") >= 0)
        )
        .with_columns(
            pl.when(pl.col("kind") == "cuda_sync")
            .then(pl.col("ts") + pl.col("dur"))
            .otherwise(pl.col("ts"))
            .alias("_sort")
        )
        .sort("_sort", "idx", maintain_order=True)
    )
    for eid, kind, name, stream, ic, wait_corr in zip(
        rows["idx"].to_list(),
        rows["kind"].to_list(),
        rows["name"].to_list(),
        rows["hstream"].to_list(),
        rows["index_correlation"].to_list(),
        rows["wait_on_cuda_event_record_corr_id"].to_list(),
    ):
        if kind == "cuda_sync":
            walk.sync(name, stream, ic, wait_corr)
        else:
            walk.kernel(eid, name, stream, ic)


@dataclass
class _KernelWalk:
    """The state of ``_kernel_edges``' walk: the last node of each stream, and the pending
    ``Stream Wait Event`` synchronisation of each kernel (kernel idx -> source kernel idx)."""

    E: _Edges
    start_node: Any
    end_node: Any
    node_ts: list[int]
    attribute: Callable[[int, int, int, int | None], None]
    zero_launch: bool
    warnings: list[str]
    ql: dict[int, int]
    prev_launch: Any
    next_launch: Any
    full_ts: dict[int, int]
    full_ic: dict[int, int]
    last_node: dict[int, int] = field(default_factory=dict)
    kernel_sync: dict[int, int | None] = field(default_factory=dict)

    def sync(self, name: str, stream: int, ic: int, wait_corr: int) -> None:
        """A synchronisation call: ``Stream Wait Event`` marks the next kernel launched after it;
        ``Event Sync``, ``Stream Sync`` and ``Context Sync`` add GPU -> runtime edges."""
        end_node = self.end_node
        if name in ("Stream Wait Event", "Event Sync"):
            launch = self.prev_launch.get(wait_corr, -1) if self.prev_launch else -1
            if launch < 0:
                return
            src_kernel = self.full_ic.get(launch, -1)
            if name == "Stream Wait Event":
                dest_launch = self.next_launch.get(ic, -1)
                if dest_launch >= 0:
                    self.kernel_sync[self.full_ic.get(dest_launch, -1)] = src_kernel
                return
            gpu_end = _at(end_node, src_kernel)
            rt_end = _at(end_node, ic)
            if gpu_end is not None and rt_end is not None:
                self.E.add(gpu_end, rt_end, _SYNC)
            return
        if name in ("Stream Sync", "Context Sync"):
            rt_end = _at(end_node, ic)
            last_node = self.last_node
            targets = list(last_node.values()) if name == "Context Sync" else [last_node.get(stream)]
            for gnode in targets:
                if gnode is not None and rt_end is not None:
                    self.E.add(gnode, rt_end, _SYNC)

    def _incoming_sync(self, eid: int, s: int) -> tuple[int | None, int | None]:
        """The pending synchronisation of kernel ``eid`` as (source kernel, its end node), its
        edge added to ``s``; consumed."""
        sync_src = self.kernel_sync.get(eid)
        if sync_src is None:
            return None, None
        sync_end = _at(self.end_node, sync_src)
        if sync_end is None:
            sync_src = None
        else:
            self.E.add(sync_end, s, _SYNC)
        self.kernel_sync[eid] = None
        return sync_src, sync_end

    def kernel(self, eid: int, name: str, stream: int, ic: int) -> None:
        """A GPU op: its own edge, then a launch edge from its runtime call when the queue was
        empty, else a kernel-kernel edge from the previous op of its stream when close."""
        E, node_ts = self.E, self.node_ts
        s = _at(self.start_node, eid)
        en = _at(self.end_node, eid)
        if s is None or en is None:
            return
        E.add(s, en, _OPK)
        self.attribute(s, en, _OPK, -1)
        sync_src, sync_end = self._incoming_sync(eid, s)
        edge_added = sync_src is not None
        launch_added = False
        rt_ts = self.full_ts.get(ic)
        prev = self.last_node.get(stream)
        if (
            self.ql.get(ic) == 1
            and self.ql.get(eid) == 0
            and (prev is None or (rt_ts is not None and node_ts[prev] < rt_ts))
            and (
                sync_src is None or (sync_end is not None and rt_ts is not None and node_ts[sync_end] < rt_ts)
            )
        ):
            rs = _at(self.start_node, ic)
            if rs is not None:
                E.add(rs, s, _KLD)
                edge_added = launch_added = True
        elif (
            prev is not None
            and node_ts[s] - node_ts[prev] < KERNEL_KERNEL_DELAY_THRESHOLD_NS
            and (sync_src is None or (sync_end is not None and node_ts[sync_end] < node_ts[prev]))
        ):
            E.add(prev, s, _KKD)
            self.attribute(prev, s, _KKD, -1)
            edge_added = True
        if not edge_added and len(self.warnings) < 50:
            self.warnings.append(f"no launch or kernel-kernel edge for GPU op idx={eid} ({name[:60]})")
        if self.zero_launch and not launch_added:
            rs = _at(self.start_node, ic)
            if rs is not None:
                E.add(rs, s, _KLD, zero_weight=True)
        self.last_node[stream] = en


def _dag_longest_path(n: int, src: np.ndarray, dst: np.ndarray, w: np.ndarray) -> np.ndarray | None:
    """``networkx.dag_longest_path`` with the same result, in one O(V + E) pass.

    networkx walks the nodes in ``topological_sort`` order (Kahn generations starting from the
    sources in the order edges first mention them, successors in edge order) and gives each node
    its best predecessor, the first maximum in predecessor (edge insertion) order; the path ends
    at the first node of that order with the largest distance. Distances do not depend on the
    order, so this pushes them along successors while running the same Kahn order, and breaks
    ties on the predecessor's rank in the node's predecessor list. Returns None if the graph has
    a cycle."""
    m = len(src)
    if n == 0 or m == 0:
        return np.zeros(0, dtype=np.int64)
    # rank of each edge among its destination's predecessors (insertion order)
    by_dst = np.argsort(dst, kind="stable")
    rank = np.empty(m, dtype=np.int64)
    dsorted = dst[by_dst]
    group_start = np.searchsorted(dsorted, dsorted, side="left")
    rank[by_dst] = np.arange(m) - group_start
    # successors in insertion order
    by_src = np.argsort(src, kind="stable")
    ptr = np.searchsorted(src[by_src], np.arange(n + 1)).tolist()
    succ = dst[by_src].tolist()
    sw = w[by_src].tolist()
    sr = rank[by_src].tolist()
    indeg = np.bincount(dst, minlength=n)
    in_graph = np.zeros(n, dtype=bool)
    in_graph[src] = True
    in_graph[dst] = True
    n_in = int(in_graph.sum())
    dist = np.where(indeg > 0, -1, 0).tolist()
    back = list(range(n))
    brank = [m] * n
    indeg_l = indeg.tolist()
    # networkx adds nodes as edges first mention them, and starts from the sources in that order
    mentions = np.empty(2 * m, dtype=np.int64)
    mentions[0::2] = src
    mentions[1::2] = dst
    uniq, first = np.unique(mentions, return_index=True)
    appearance = uniq[np.argsort(first, kind="stable")]
    # Kahn's generations in order == one FIFO queue seeded with the sources
    order = appearance[indeg[appearance] == 0].tolist()
    best_v = order[0] if order else -1
    best_d = -1
    i = 0
    while i < len(order):
        x = order[i]
        i += 1
        dx = dist[x]
        if dx > best_d:  # first node in topological order with the largest distance
            best_d = dx
            best_v = x
        for k in range(ptr[x], ptr[x + 1]):
            y = succ[k]
            c = dx + sw[k]
            dy = dist[y]
            if c > dy or (c == dy and sr[k] < brank[y]):
                dist[y] = c
                back[y] = x
                brank[y] = sr[k]
            indeg_l[y] -= 1
            if indeg_l[y] == 0:
                order.append(y)
    if len(order) != n_in:
        return None
    path = [best_v]
    while back[path[-1]] != path[-1]:
        path.append(back[path[-1]])
    path.reverse()
    return np.asarray(path, dtype=np.int64)


def _cp_for(trace: Trace, annotation: str | None, instance_id: Any, **kwargs: Any) -> CriticalPath:
    if annotation is None:
        has_step = trace.events.select(pl.col("name").str.starts_with("ProfilerStep").any()).item()
        annotation = "ProfilerStep" if has_step else ""
    if isinstance(instance_id, list):
        instance_id = tuple(instance_id)
    return critical_path(trace, annotation, instance_id, **kwargs)


CP_SUMMARY_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "bound_by": pl.String(),
    "duration (us)": pl.Float64(),
    "percentage": pl.Float64(),
}


def critical_path_summary(
    traces: TraceInput,
    annotation: str | None = None,
    instance_id: int | tuple[int, int] | list[int] | None = 0,
    data_load_events: Sequence[str] | None = None,
    add_zero_weight_launch_edges: bool = False,
) -> pl.DataFrame:
    """Registry entry: the ``bound_by`` summary of each trace's critical path. With no
    annotation it analyses the first ``ProfilerStep`` when the trace has one, else the whole
    trace."""

    def one_rank(t: Trace) -> pl.DataFrame | None:
        cp = _cp_for(
            t,
            annotation,
            instance_id,
            data_load_events=data_load_events,
            add_zero_weight_launch_edges=add_zero_weight_launch_edges,
        )
        return cp.summary().with_columns(rank_lit(t))

    return per_rank(traces, one_rank, CP_SUMMARY_SCHEMA)


def critical_path_breakdown(
    traces: TraceInput,
    annotation: str | None = None,
    instance_id: int | tuple[int, int] | list[int] | None = 0,
    data_load_events: Sequence[str] | None = None,
    add_zero_weight_launch_edges: bool = False,
) -> pl.DataFrame:
    """Registry entry: every edge of each trace's critical path (``CriticalPath.breakdown``)."""

    def one_rank(t: Trace) -> pl.DataFrame | None:
        cp = _cp_for(
            t,
            annotation,
            instance_id,
            data_load_events=data_load_events,
            add_zero_weight_launch_edges=add_zero_weight_launch_edges,
        )
        return cp.breakdown().with_columns(rank_lit(t))

    schema = {"rank": pl.Int64(), **dict(CriticalPath.breakdown_schema())}
    return per_rank(traces, one_rank, schema)


_CP_OPTIONS = {
    "annotation": None,
    "instance_id": 0,
    "data_load_events": None,
    "add_zero_weight_launch_edges": False,
}
register(
    AnalysisSpec(
        name="critical_path",
        func=critical_path_summary,
        combine="concat",
        reads=CRITICAL_PATH_READS,
        description="Lightweight critical path of a step (or the whole trace): share bound by CPU, GPU compute, communication, launch and kernel-kernel overhead.",
        default=False,
        options=_CP_OPTIONS,
        order=82,
        group="heavy",
        empty_note="no critical path (no events in the window)",
    )
)
register(
    AnalysisSpec(
        name="critical_path_breakdown",
        func=critical_path_breakdown,
        combine="concat",
        reads=CRITICAL_PATH_READS,
        description="Every edge on the critical path with the event it is attributed to and what it is bound by.",
        default=False,
        options=_CP_OPTIONS,
        order=83,
        group="heavy",
        empty_note="no critical path (no events in the window)",
    )
)
