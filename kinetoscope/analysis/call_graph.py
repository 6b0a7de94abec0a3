"""CPU call stacks with GPU work attached (HTA ``CallGraph``, §1.17), in linear time.

For every host event (CPU op, user annotation, Python function, runtime/driver call) we compute
its ``parent`` (the ``idx`` of the enclosing event on the same ``(pid, tid)``, null at top level)
and ``depth`` (0 at top level). Every device event (kernel, memcpy, memset, MTIA device event)
is attached under the runtime call that launched it (matched on ``correlation``), one level
deeper. For each host event we then sum the device work in its subtree: ``num_kernels``,
``kernel_dur_sum``, ``first_kernel_start``, ``last_kernel_end`` and ``kernel_span``.

Nesting rule (one sort plus one stack sweep per thread):

* events are ordered by ``(ts, longer first, idx)``;
* the innermost open event is closed before an event that starts at or after its end; events
  that only touch (``a.end == b.ts``) are siblings;
* a zero-duration event at the exact end of an open event is inside it (HTA's rule), and two
  zero-duration events at the same time are siblings;
* negative durations (malformed traces) count as zero; an event that overlaps its parent's end
  stays its child (HTA does the same), so no input makes the sweep fail.

HTA sorts every start/end point with a Python comparator that is not a total order and raises
``ValueError: Unexpected case`` on negative durations (§3.6, ``ns_resolution_trace``). Here the
order is a plain lexicographic sort.

Like HTA, when exactly one thread holds ``ProfilerStep#`` annotations ("main") and another holds
``autograd::`` ops ("bwd"), the top-level backward ops are re-parented under the main thread's
``## backward ##`` annotation (else ``ProfilerStep#``) that contains them, so step-level kernel
totals include backward kernels. Unlike HTA, CUDA synchronisation rows (``Stream Sync``,
``Context Sync``...) are not counted as kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from kinetoscope.analysis._common import TraceInput, per_rank, rank_lit
from kinetoscope.analysis.reads import CALL_GRAPH_READS
from kinetoscope.analysis.registry import AnalysisSpec, register
from kinetoscope.trace.model import Trace
from kinetoscope.trace.schema import DEVICE_KINDS

# Kinds that are not host-side call-stack events.
NON_HOST_KINDS: frozenset[str] = frozenset(DEVICE_KINDS) | {
    "cuda_sync",
    "gpu_user_annotation",
    "cuda_profiler_range",
    "trace",
}

CALL_GRAPH_COLUMNS = [
    "idx",
    "kind",
    "name",
    "pid",
    "tid",
    "ts",
    "dur",
    "is_device",
    "parent",
    "depth",
    "height",
    "num_kernels",
    "kernel_dur_sum",
    "first_kernel_start",
    "last_kernel_end",
    "kernel_span",
]


def host_events(trace: Trace) -> pl.DataFrame:
    """Host-side complete events (everything that can nest on a CPU thread)."""
    return trace.events.filter(~pl.col("kind").cast(pl.String).is_in(list(NON_HOST_KINDS)))


def _nest(group: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stack sweep over events already sorted by (group, ts, -dur, idx).

    Returns (parent position or -1, depth, top-level ancestor position) per row.
    """
    n = len(ts)
    parent = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    top = np.arange(n, dtype=np.int64)
    if n == 0:
        return parent, depth, top
    end = ts + dur
    bounds = np.flatnonzero(np.diff(group)) + 1
    starts = np.concatenate(([0], bounds)).tolist()
    stops = np.concatenate((bounds, [n])).tolist()
    ts_l = ts.tolist()
    dur_l = dur.tolist()
    end_l = end.tolist()
    parent_l = [-1] * n
    depth_l = [0] * n
    top_l = list(range(n))
    for a, b in zip(starts, stops):
        stack: list[int] = []
        for i in range(a, b):
            t = ts_l[i]
            d = dur_l[i]
            while stack:
                j = stack[-1]
                e = end_l[j]
                if e < t or (e == t and (d > 0 or dur_l[j] == 0)):
                    stack.pop()
                else:
                    break
            if stack:
                j = stack[-1]
                parent_l[i] = j
                depth_l[i] = len(stack)
                top_l[i] = top_l[stack[0]]
            stack.append(i)
    parent[:] = parent_l
    depth[:] = depth_l
    top[:] = top_l
    return parent, depth, top


@dataclass
class CallGraph:
    """Call stacks of one trace: ``nodes`` has one row per host event and per attached device
    event, sorted by ``idx`` (columns ``CALL_GRAPH_COLUMNS``; times in ns)."""

    nodes: pl.DataFrame
    linked_backward: bool = False
    _idx: np.ndarray = field(init=False, repr=False)
    _parent_pos: np.ndarray = field(init=False, repr=False)
    _depth: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._idx = self.nodes["idx"].to_numpy()
        parent = self.nodes["parent"].fill_null(-1).to_numpy()
        pos = np.searchsorted(self._idx, parent)
        pos = np.where(parent >= 0, np.minimum(pos, max(len(self._idx) - 1, 0)), -1)
        self._parent_pos = pos.astype(np.int64)
        self._depth = self.nodes["depth"].to_numpy().astype(np.int64)

    # ---- lookups -----------------------------------------------------------------------
    def __len__(self) -> int:
        return self.nodes.height

    def positions(self, idx: np.ndarray | list[int]) -> np.ndarray:
        """Row positions of event ``idx`` values (-1 where the event is not in the graph)."""
        q = np.asarray(idx, dtype=np.int64)
        if len(self._idx) == 0:
            return np.full(q.shape, -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self._idx, q), len(self._idx) - 1)
        return np.where(self._idx[pos] == q, pos, -1)

    @property
    def parent_positions(self) -> np.ndarray:
        return self._parent_pos

    @property
    def depths(self) -> np.ndarray:
        return self._depth

    def ancestors(self, idx: int) -> list[int]:
        """``idx`` values from the parent of ``idx`` up to its top-level ancestor."""
        out: list[int] = []
        p = int(self.positions([idx])[0])
        if p < 0:
            return out
        p = int(self._parent_pos[p])
        while p >= 0:
            out.append(int(self._idx[p]))
            p = int(self._parent_pos[p])
        return out

    def subtree_label(self, root_positions: np.ndarray) -> np.ndarray:
        """For every row, the position of its nearest ancestor-or-self in ``root_positions``
        (-1 if none). One vectorised pass per depth level."""
        n = len(self._idx)
        label = np.full(n, -1, dtype=np.int64)
        if n == 0 or len(root_positions) == 0:
            return label
        roots = np.asarray(root_positions, dtype=np.int64)
        label[roots] = roots
        order = np.argsort(self._depth, kind="stable")
        d_sorted = self._depth[order]
        cuts = np.flatnonzero(np.diff(d_sorted)) + 1
        for level in np.split(order, cuts):
            par = self._parent_pos[level]
            need = (label[level] < 0) & (par >= 0)
            if need.any():
                sel = level[need]
                label[sel] = label[self._parent_pos[sel]]
        return label

    def nearest_ancestor(self, mask: np.ndarray, include_self: bool = False) -> np.ndarray:
        """Position of the nearest ancestor (or self) whose ``mask`` is true, per row; -1 if none."""
        n = len(self._idx)
        cur = np.arange(n, dtype=np.int64) if include_self else self._parent_pos.copy()
        result = np.full(n, -1, dtype=np.int64)
        active = np.flatnonzero(cur >= 0)
        while len(active):
            c = cur[active]
            hit = mask[c]
            result[active[hit]] = c[hit]
            active = active[~hit]
            if not len(active):
                break
            nxt = self._parent_pos[cur[active]]
            cur[active] = nxt
            active = active[nxt >= 0]
        return result

    def descendants(self, idx: int, include_self: bool = True) -> pl.DataFrame:
        """Rows of the subtree under ``idx`` (kernels included), sorted by ``ts``."""
        p = self.positions([idx])
        if p[0] < 0:
            return self.nodes.clear()
        label = self.subtree_label(p)
        mask = label == p[0]
        if not include_self:
            mask[p[0]] = False
        return self.nodes.filter(pl.Series(mask)).sort("ts", "idx")

    def stack_of(self, idx: int, skip_ancestors: bool = False) -> pl.DataFrame:
        """HTA ``get_stack_of_node``: the event, its subtree and (unless skipped) its ancestors;
        for a device event, the stack of its launch."""
        p = self.positions([idx])
        if p[0] < 0:
            return self.nodes.clear()
        if bool(self.nodes["is_device"][int(p[0])]):
            parent = self.nodes["parent"][int(p[0])]
            below = self.nodes[int(p[0]) : int(p[0]) + 1]
            if parent is None:
                return below
            ups = [] if skip_ancestors else [int(parent), *self.ancestors(int(parent))]
            return pl.concat([below, self.nodes.filter(pl.col("idx").is_in(ups))]).sort("ts", "idx")
        sub = self.descendants(idx)
        if skip_ancestors:
            return sub
        ups = self.ancestors(idx)
        return pl.concat([sub, self.nodes.filter(pl.col("idx").is_in(ups))]).sort("ts", "idx")


def _nesting_order(df: pl.DataFrame) -> pl.DataFrame:
    """Sort host events for the stack sweep: by thread, then ``ts``; at equal ``ts`` longer
    events first (ties by ``idx``), and a zero-duration event placed by file order among them
    (after the same-``ts`` events written before it). So a zero-length op written just before
    an op starting at the same time stays in the op that ends there, and one written after it
    goes inside it."""
    if df.is_empty():
        return df
    pid = df["pid"].to_numpy()
    tid = df["tid"].to_numpy()
    ts = df["ts"].to_numpy()
    d = df["_d"].to_numpy()
    idx = df["idx"].to_numpy()
    nz = d > 0
    # rank of each positive-duration event among same-(pid, tid, ts) events: longer first
    o1 = np.lexsort((idx, -d, ts, tid, pid))
    new_group = np.ones(len(o1), dtype=bool)
    new_group[1:] = (
        (pid[o1][1:] != pid[o1][:-1]) | (tid[o1][1:] != tid[o1][:-1]) | (ts[o1][1:] != ts[o1][:-1])
    )
    cs = np.cumsum(nz[o1])
    start_cs = np.maximum.accumulate(np.where(new_group, cs - nz[o1], 0))
    rank = np.empty(len(o1), dtype=np.int64)
    rank[o1] = cs - start_cs - 1
    # zero-duration events go after the same-ts positive events that precede them in the file
    o2 = np.lexsort((idx, ts, tid, pid))
    gid = np.cumsum(new_group)  # group ids are the same set in both orders
    gid_of = np.empty(len(o1), dtype=np.int64)
    gid_of[o1] = gid
    g2 = gid_of[o2]
    big = 4 * (len(o1) + 2)
    val = np.where(nz[o2], rank[o2], -1) + g2 * big
    k = np.maximum.accumulate(val) - g2 * big
    key = np.empty(len(o1), dtype=np.int64)
    key[o2] = np.where(nz[o2], 2 * rank[o2], 2 * k + 1)
    order = np.lexsort((idx, key, ts, tid, pid))
    return df[order]


def _thread_labels(host: pl.DataFrame) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """(main thread, backward thread) as HTA labels them, or None when not exactly one each."""
    per = host.group_by("pid", "tid").agg(
        pl.col("name").str.starts_with("ProfilerStep#").any().alias("main"),
        pl.col("name").str.contains("autograd::", literal=True).any().alias("bwd"),
    )
    mains = per.filter(pl.col("main"))
    bwds = per.filter(~pl.col("main") & pl.col("bwd"))
    if mains.height != 1 or bwds.height != 1:
        return None, None
    return (int(mains["pid"][0]), int(mains["tid"][0])), (int(bwds["pid"][0]), int(bwds["tid"][0]))


def build_call_graph(trace: Trace, *, link_backward: bool = True) -> CallGraph:
    """Build the call graph of one trace (see the module docstring for the rules)."""
    host = host_events(trace).select("idx", "kind", "name", "pid", "tid", "ts", "dur")
    host = _nesting_order(
        host.with_columns(
            pl.col("pid").fill_null(-(2**62)),
            pl.col("tid").fill_null(-(2**62)),
            pl.col("dur").fill_null(0).clip(lower_bound=0).alias("_d"),
        )
    )
    n_host = host.height

    # group id per (pid, tid)
    gkey = (
        host.select(pl.struct("pid", "tid").rank("dense").alias("g"))["g"].to_numpy()
        if n_host
        else np.zeros(0)
    )
    ts = host["ts"].to_numpy().astype(np.int64)
    dur = host["_d"].to_numpy().astype(np.int64)
    ppos, depth, top = _nest(np.asarray(gkey), ts, dur)
    hidx = host["idx"].to_numpy()
    parent_idx = np.where(ppos >= 0, hidx[np.maximum(ppos, 0)], -1)

    linked = False
    if link_backward and n_host:
        depth, linked = _link_backward(host, ts, dur, ppos, parent_idx, depth, top)

    nodes_host = host.select("idx", "kind", "name", "pid", "tid", "ts", "dur").with_columns(
        pl.lit(False).alias("is_device"),
        pl.when(pl.Series(parent_idx >= 0)).then(pl.Series(parent_idx)).otherwise(None).alias("parent"),
        pl.Series("depth", depth, dtype=pl.Int64),
    )
    dev = _device_nodes(trace, nodes_host)
    nodes = pl.concat([nodes_host, dev], how="vertical_relaxed").sort("idx")
    cg = CallGraph(
        nodes.with_columns(
            pl.lit(0, dtype=pl.Int64).alias("height"),
            pl.lit(0, dtype=pl.Int64).alias("num_kernels"),
            pl.lit(0, dtype=pl.Int64).alias("kernel_dur_sum"),
            pl.lit(None, dtype=pl.Int64).alias("first_kernel_start"),
            pl.lit(None, dtype=pl.Int64).alias("last_kernel_end"),
            pl.lit(0, dtype=pl.Int64).alias("kernel_span"),
        ),
        linked_backward=linked,
    )
    _aggregate_kernels(cg)
    return cg


def _link_backward(
    host: pl.DataFrame,
    ts: np.ndarray,
    dur: np.ndarray,
    ppos: np.ndarray,
    parent_idx: np.ndarray,
    depth: np.ndarray,
    top: np.ndarray,
) -> tuple[np.ndarray, bool]:
    """Put the backward thread's top-level events under the first main-thread annotation
    (``## backward ##``, else ``ProfilerStep#``, in file order) that contains them, as HTA
    does. Updates ``ppos`` and ``parent_idx`` in place; returns the new depths and whether any
    event moved."""
    main, bwd = _thread_labels(host)
    if main is None or bwd is None:
        return depth, False
    hidx = host["idx"].to_numpy()
    pids = host["pid"].to_numpy()
    tids = host["tid"].to_numpy()
    on_main = (pids == main[0]) & (tids == main[1])
    on_bwd = (pids == bwd[0]) & (tids == bwd[1])
    anns = _first_annotations(on_main, host["name"])
    if anns is None:
        return depth, False
    anns = anns[np.argsort(hidx[anns], kind="stable")]  # HTA iterates in file order
    a_ts = ts[anns]
    a_end = ts[anns] + dur[anns]
    roots = np.flatnonzero(on_bwd & (ppos < 0))
    r_ts = ts[roots]
    r_end = r_ts + dur[roots]
    # first annotation (file order) that contains each backward root
    new_par = np.full(len(roots), -1, dtype=np.int64)
    for a, s0, e0 in zip(anns.tolist(), a_ts.tolist(), a_end.tolist()):
        hit = (new_par < 0) & (r_ts >= s0) & (r_end <= e0)
        new_par[hit] = a
    has = new_par >= 0
    if not has.any():
        return depth, False
    moved = roots[has]
    offset = np.zeros(host.height, dtype=np.int64)
    offset[moved] = depth[new_par[has]] + 1
    ppos[moved] = new_par[has]
    parent_idx[moved] = hidx[new_par[has]]
    # every node in a moved subtree shifts by its top-level ancestor's offset
    return depth + offset[top], True


def _first_annotations(on_main: np.ndarray, names: pl.Series) -> np.ndarray | None:
    """Positions of the main thread's ``## backward ##`` annotations, else its
    ``ProfilerStep#`` ones; None when it has neither."""
    for prefix in ("## backward ##", "ProfilerStep#"):
        m = on_main & names.str.starts_with(prefix).fill_null(False).to_numpy()
        if m.any():
            return np.flatnonzero(m)
    return None


def _device_nodes(trace: Trace, nodes_host: pl.DataFrame) -> pl.DataFrame:
    """Device events as nodes under their launches (one level deeper than the launch)."""
    links = trace.launch_links().unique("gpu_idx", keep="first").select("gpu_idx", "launch_idx")
    return (
        trace.device_events()
        .select("idx", "kind", "name", "pid", "tid", "ts", "dur")
        .join(links, left_on="idx", right_on="gpu_idx", how="inner")
        .join(
            nodes_host.select(pl.col("idx").alias("launch_idx"), pl.col("depth").alias("_ld")),
            on="launch_idx",
            how="inner",
        )
        .select(
            "idx",
            "kind",
            "name",
            "pid",
            "tid",
            "ts",
            "dur",
            pl.lit(True).alias("is_device"),
            pl.col("launch_idx").alias("parent"),
            (pl.col("_ld") + 1).alias("depth"),
        )
    )


def _aggregate_kernels(cg: CallGraph) -> None:
    """Fill height and the subtree kernel columns, one vectorised pass per depth level."""
    nodes = cg.nodes
    n = nodes.height
    if n == 0:
        return
    is_dev = nodes["is_device"].to_numpy()
    ts = nodes["ts"].to_numpy().astype(np.int64)
    dur = np.maximum(nodes["dur"].fill_null(0).to_numpy().astype(np.int64), 0)
    big = np.iinfo(np.int64).max
    num = is_dev.astype(np.int64)
    dsum = np.where(is_dev, dur, 0)
    first = np.where(is_dev, ts, big)
    last = np.where(is_dev, ts + dur, -big)
    height = np.where(is_dev, 0, 1).astype(np.int64)
    par = cg.parent_positions
    depth = cg.depths
    order = np.argsort(-depth, kind="stable")
    d_sorted = depth[order]
    cuts = np.flatnonzero(np.diff(d_sorted)) + 1
    for level in np.split(order, cuts):
        p = par[level]
        ok = p >= 0
        if not ok.any():
            continue
        c = level[ok]
        pp = p[ok]
        np.add.at(num, pp, num[c])
        np.add.at(dsum, pp, dsum[c])
        np.minimum.at(first, pp, first[c])
        np.maximum.at(last, pp, last[c])
        np.maximum.at(height, pp, height[c] + 1)
    has = num > 0
    cg.nodes = nodes.with_columns(
        pl.Series("height", height),
        pl.Series("num_kernels", num),
        pl.Series("kernel_dur_sum", dsum),
        pl.when(pl.Series(has)).then(pl.Series(first)).otherwise(None).alias("first_kernel_start"),
        pl.when(pl.Series(has)).then(pl.Series(last)).otherwise(None).alias("last_kernel_end"),
        pl.Series("kernel_span", np.where(has, last - first, 0)),
    )


OP_KERNEL_SUMMARY_SCHEMA: dict[str, pl.DataType] = {
    "name": pl.String(),
    "count": pl.Int64(),
    "min_depth": pl.Int64(),
    "cpu_dur_sum (us)": pl.Float64(),
    "num_kernels": pl.Int64(),
    "kernel_dur_sum (us)": pl.Float64(),
    "kernel_span_sum (us)": pl.Float64(),
}


def op_kernel_summary(trace: Trace, *, call_graph: CallGraph | None = None) -> pl.DataFrame:
    """Per CPU op name: how often it runs, how deep, and the GPU work under it (µs).

    Columns: ``name, count, min_depth, cpu_dur_sum (us), num_kernels, kernel_dur_sum (us),
    kernel_span_sum (us)``; ops without kernels are left out; sorted by kernel time. Nested ops
    each count their whole subtree (an op and its child both include the child's kernels).
    """
    cg = call_graph or build_call_graph(trace)
    return (
        cg.nodes.filter(~pl.col("is_device") & (pl.col("kind") == "cpu_op") & (pl.col("num_kernels") > 0))
        .group_by("name")
        .agg(
            pl.len().alias("count"),
            pl.col("depth").min().alias("min_depth"),
            (pl.col("dur").sum() / 1000).alias("cpu_dur_sum (us)"),
            pl.col("num_kernels").sum(),
            (pl.col("kernel_dur_sum").sum() / 1000).alias("kernel_dur_sum (us)"),
            (pl.col("kernel_span").sum() / 1000).alias("kernel_span_sum (us)"),
        )
        .sort(["kernel_dur_sum (us)", "name"], descending=[True, False])
    )


def call_graph_summary(traces: TraceInput) -> pl.DataFrame:
    """Registry entry: ``op_kernel_summary`` per trace with a ``rank`` column."""
    schema = {"rank": pl.Int64(), **OP_KERNEL_SUMMARY_SCHEMA}
    return per_rank(traces, lambda t: op_kernel_summary(t).with_columns(rank_lit(t)), schema)


register(
    AnalysisSpec(
        name="call_graph",
        func=call_graph_summary,
        combine="concat",
        reads=CALL_GRAPH_READS,
        description="CPU ops with the GPU work they launch (call stacks + kernels): count, depth, CPU and kernel time per op name.",
        default=False,
        order=80,
        group="heavy",
        empty_note="no CPU op launched a kernel",
    )
)
