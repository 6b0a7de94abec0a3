"""Pipeline parallelism, per rank: the ``StepCut`` of each of a rank's own steps.

The per-rank half of ``diagnosis.pipeline`` (whose docstring defines the terms: idle, compute,
the wait for upstream, micro-batch marks). ``rank_cuts`` reads one rank's trace alone, on its own
clock, so ``extract.rank_figures`` computes it in the map task of a map/reduce and a
``DigestTrace`` carries it; ``pipeline.analyze_pipeline`` places the cuts on the job's steps and
decides stages, schedule and imbalance. Kept apart from the job-level half so the figures
(``extract``) import this module and ``pipeline`` imports the figures, without a circle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from kinetoscope.analysis.kernel_types import COMMUNICATION_PATTERN
from kinetoscope.trace.model import Trace

P2P_SPAN = r"^(?:gloo|mpi|ucc|nccl):(?:send|recv)$|(?i)SendRecv|ncclDevKernel_(?:Send|Recv)"
P2P_POST = r"^c10d::(?:send|recv_?|recv_any_source_?)$"
_P2P_ANY = r"(?i)(?:^|[:_])(?:send|recv)"
_MB = re.compile(r"^(Forward|Backward) (\d+)$")
_PP = re.compile(r"^PP:(\d+)([FBIW])(\d+)$")

Intervals = np.ndarray  # shape (n, 2), int64 ns, sorted and disjoint after _union
# A gap between a CPU rank's ops shorter than this is host work (Python between ops), not a wait.
WAIT_GAP_NS = 200_000


def _union(iv: Intervals) -> Intervals:
    """Sorted, disjoint union of ``[start, end)`` rows."""
    if len(iv) == 0:
        return np.empty((0, 2), dtype=np.int64)
    iv = iv[np.argsort(iv[:, 0], kind="stable")]
    out: list[list[int]] = [[int(iv[0, 0]), int(iv[0, 1])]]
    for s, e in iv[1:]:
        if s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], int(e))
        else:
            out.append([int(s), int(e)])
    return np.asarray(out, dtype=np.int64)


def _length(iv: Intervals) -> int:
    return int((iv[:, 1] - iv[:, 0]).sum()) if len(iv) else 0


def _intersection(a: Intervals, b: Intervals) -> int:
    """Length of the intersection of two unions (both sorted and disjoint)."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i, 0], b[j, 0]), min(a[i, 1], b[j, 1])
        total += max(0, int(hi - lo))
        if a[i, 1] < b[j, 1]:
            i += 1
        else:
            j += 1
    return total


def _clip(iv: Intervals, lo: int, hi: int) -> Intervals:
    """``iv`` (sorted, disjoint) clipped to ``[lo, hi)``; only the rows that overlap it are read
    (a step reads its own window, not the whole trace: linear in steps)."""
    if len(iv) == 0:
        return iv
    a = int(np.searchsorted(iv[:, 1], lo, side="right"))
    b = int(np.searchsorted(iv[:, 0], hi, side="left"))
    c = np.clip(iv[a:b], lo, hi)
    out: Intervals = c[c[:, 1] > c[:, 0]]
    return out


@dataclass
class RankPipe:
    """One rank's point-to-point and compute intervals (aligned ns) and its micro-batch marks."""

    p2p: Intervals  # send and receive spans
    compute: Intervals
    coll: Intervals  # collectives that are not send/recv (GPU kernels, CPU backend annotations)
    posts: pl.DataFrame  # ts, op ("send" | "recv"), end
    recv_done: np.ndarray  # sorted ends of the receive spans (completions)
    marks: pl.DataFrame  # ts, end, kind (F/B/I/W), mb, stage_id (-1 when not recorded)
    gpu: bool


def rank_cuts(trace: Trace, steps: pl.DataFrame) -> dict[int, StepCut] | None:
    """``trace``'s ``StepCut`` of each of its own steps (``steps``: ``detect_steps``, own clock;
    ``StepCut.step`` = the local step, ``rank`` 0), or None when no event of it looks like a send
    or receive (then the job is no pipeline). The per-rank figure ``RankFigures.pipe``: O(steps
    x micro-batches). The job's step windows are these windows moved by the rank's clock offset
    (``breakdown.step_table``) and a cut only reads times relative to its window, so
    ``placed`` gives the cut that the events at that offset give."""
    if not trace.events["name"].str.contains(_P2P_ANY).any():
        return None
    rp = _rank_pipe(trace, 0)
    return {
        int(step): _cut(0, int(step), int(start), int(end), rp)
        for step, start, end in steps.select("step", "start", "end").iter_rows()
    }


def placed(cut: StepCut, rank: int, step: int, offset: int) -> StepCut:
    """``cut`` (own clock, local step) as the job's ``step`` of ``rank``, times moved by ``offset``."""
    return replace(
        cut,
        rank=rank,
        step=step,
        start=cut.start + offset,
        end=cut.end + offset,
        first_recv_end=None if cut.first_recv_end is None else cut.first_recv_end + offset,
        first_post=None if cut.first_post is None else cut.first_post + offset,
    )


def _rank_pipe(trace: Trace, offset: int) -> RankPipe:
    # the columns read below only: not a copy of every column of the whole events table
    ev = (
        trace.events.select("kind", "name", "ts", "dur")
        .filter(pl.col("dur").is_not_null())
        .with_columns(
            (pl.col("ts") + offset).alias("ts"), (pl.col("ts") + offset + pl.col("dur")).alias("end")
        )
    )
    kinds = ev["kind"].cast(pl.String)
    ev = ev.with_columns(kinds.alias("k"))
    p2p = ev.filter(pl.col("name").str.contains(P2P_SPAN))
    posts = ev.filter((pl.col("k") == "cpu_op") & pl.col("name").str.contains(P2P_POST))
    if posts.is_empty():  # annotations only: their start is the post
        posts = p2p.filter(pl.col("k") != "kernel")
    posts = posts.select(
        "ts",
        "end",
        pl.when(pl.col("name").str.contains("(?i)send"))
        .then(pl.lit("send"))
        .otherwise(pl.lit("recv"))
        .alias("op"),
    ).sort("ts")
    kern = ev.filter(pl.col("k") == "kernel")
    gpu = kern.height > 0
    coll = kern.filter(
        pl.col("name").str.contains(COMMUNICATION_PATTERN) & ~pl.col("name").str.contains(P2P_SPAN)
    )
    if not gpu:  # the backend's collective annotations (gloo:all_reduce): the spans a wait for them fills
        coll = ev.filter(
            (pl.col("k") == "user_annotation")
            & pl.col("name").str.contains(r"^(?:gloo|mpi|ucc):")
            & ~pl.col("name").str.contains(P2P_SPAN)
        )
    if gpu:
        comp = kern.filter(~pl.col("name").str.contains(COMMUNICATION_PATTERN))
    else:
        comp = ev.filter(
            (pl.col("k") == "cpu_op") & ~pl.col("name").str.contains(r"^c10d::|^(?:gloo|nccl|mpi|ucc):")
        )
    marks = _marks(ev.filter(pl.col("k") == "user_annotation"))
    recv = p2p.filter(pl.col("name").str.contains("(?i)recv"))
    done = recv["end"].sort().to_numpy().astype(np.int64)
    return RankPipe(
        p2p=_union(p2p.select("ts", "end").to_numpy().astype(np.int64)),
        compute=_union(comp.select("ts", "end").to_numpy().astype(np.int64)),
        coll=_union(coll.select("ts", "end").to_numpy().astype(np.int64)),
        posts=posts,
        recv_done=done,
        marks=marks,
        gpu=gpu,
    )


def _marks(ann: pl.DataFrame) -> pl.DataFrame:
    rows: list[tuple[int, int, str, int, int]] = []
    for name, ts, end in ann.select("name", "ts", "end").iter_rows():
        m = _MB.match(name)
        if m:
            rows.append((ts, end, m.group(1)[0], int(m.group(2)), -1))
            continue
        m = _PP.match(name)
        if m:
            rows.append((ts, end, m.group(2), int(m.group(3)), int(m.group(1))))
    schema = {"ts": pl.Int64, "end": pl.Int64, "kind": pl.String, "mb": pl.Int64, "stage_id": pl.Int64}
    return pl.DataFrame(rows, schema=schema, orient="row").sort("ts")


@dataclass
class StepCut:
    """One rank's numbers for one step."""

    rank: int
    step: int
    start: int
    end: int
    idle: int
    first_op: str | None
    first_recv_end: int | None
    sends: int
    recvs: int
    leading_recvs: int  # receives posted before the first send
    microbatches: int  # distinct micro-batch ids in F/B marks (0: none)
    fwd_ns: list[int] = field(default_factory=list)
    bwd_ns: list[int] = field(default_factory=list)
    order: str = ""  # F/B sequence of the marks (GPipe vs 1F1B)
    stage_ids: int = 0
    split_backward: bool = False
    coll_ns: int = 0  # GPU: time in (non send/recv) collectives outside compute: waits, not bubble
    first_post: int | None = None  # when the step's first send or receive was posted (aligned ns)

    @property
    def upstream_wait(self) -> int | None:
        """From the step's first post to its first completed receive: how long the rank waits for
        the stages before it (a later stage waits for more forwards). Measured from the rank's own
        post, so a replica that starts its step late (slowed) does not look like a later stage."""
        if self.first_recv_end is None or self.first_post is None:
            return None
        return self.first_recv_end - self.first_post

    @property
    def compute_ns(self) -> int:
        """The step's own work: its duration less the bubble and the collectives."""
        return self.duration - self.idle - self.coll_ns

    @property
    def duration(self) -> int:
        return self.end - self.start


def _waits(p2p: Intervals, comp: Intervals, start: int, end: int) -> Intervals:
    """Gaps of at least WAIT_GAP_NS between compute intervals, within [start, end), that a
    point-to-point span overlaps (kept whole where they overlap it)."""
    edges = (
        np.concatenate(([start], comp.ravel(), [end])).reshape(-1, 2)
        if len(comp)
        else np.array([[start, end]])
    )
    gaps = edges[(edges[:, 1] - edges[:, 0]) >= WAIT_GAP_NS]
    if len(gaps) == 0 or len(p2p) == 0:
        return np.empty((0, 2), dtype=np.int64)
    out = [
        (max(int(g0), int(a)), min(int(g1), int(b)))
        for g0, g1 in gaps
        for a, b in p2p[(p2p[:, 0] < g1) & (p2p[:, 1] > g0)]
    ]
    return _union(np.asarray(out, dtype=np.int64)) if out else np.empty((0, 2), dtype=np.int64)


def _window(df: pl.DataFrame, start: int, end: int) -> pl.DataFrame:
    """The rows of ``df`` (sorted by ``ts``) with ``start <= ts < end``, by binary search."""
    if df.is_empty():
        return df
    ts = df["ts"]
    lo, hi = int(ts.search_sorted(start, side="left")), int(ts.search_sorted(end, side="left"))
    return df.slice(lo, max(0, hi - lo))


def _cut(rank: int, step: int, start: int, end: int, rp: RankPipe) -> StepCut:
    p2p = _clip(rp.p2p, start, end)
    comp = _clip(rp.compute, start, end)
    waits = _waits(p2p, comp, start, end)
    coll_ns = 0
    if rp.gpu:
        busy = _union(np.concatenate([comp, _clip(rp.coll, start, end)])) if len(rp.coll) else comp
        coll_ns = _length(busy) - _length(comp)
        idle = end - start - _length(busy)
    else:
        idle = _length(waits)
        if len(rp.coll):  # gaps between host ops inside a collective: waiting for its peers, not work
            in_coll = _waits(_clip(rp.coll, start, end), comp, start, end)
            coll_ns = _length(in_coll) - _intersection(in_coll, waits)
    posts = _window(rp.posts, start, end)
    ops = posts["op"].to_list()
    i = int(np.searchsorted(rp.recv_done, start))
    first_recv_end = int(rp.recv_done[i]) if i < len(rp.recv_done) and rp.recv_done[i] < end else None
    first_send = ops.index("send") if "send" in ops else len(ops)
    marks = _window(rp.marks, start, end)
    fwd: list[int] = []
    bwd: list[int] = []
    for ts, e, kind in marks.select("ts", "end", "kind").iter_rows():
        own = (e - ts) - _length(_clip(waits, ts, e))
        (fwd if kind == "F" else bwd).append(own)
    return StepCut(
        rank=rank,
        step=step,
        start=start,
        end=end,
        idle=max(0, idle),
        first_op=ops[0] if ops else None,
        first_recv_end=first_recv_end,
        sends=ops.count("send"),
        recvs=ops.count("recv"),
        leading_recvs=sum(1 for o in ops[:first_send] if o == "recv"),
        microbatches=int(marks.filter(pl.col("kind") == "F")["mb"].n_unique()) if marks.height else 0,
        fwd_ns=fwd,
        bwd_ns=bwd,
        order="".join("F" if k == "F" else "B" for k in marks["kind"].to_list()),
        stage_ids=int(marks.filter(pl.col("stage_id") >= 0)["stage_id"].n_unique()) if marks.height else 0,
        split_backward=bool(marks.height and marks["kind"].is_in(["I", "W"]).any()),
        coll_ns=max(0, coll_ns),
        first_post=int(posts["ts"][0]) if posts.height else None,
    )
