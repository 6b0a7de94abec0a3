"""Importer of the OSDI '25 what-if artifact's op-level traces into a :class:`ReplayModel`.

The artifact (ByteDance-Seed/StragglerAnalysis, ``data/trace-X.parquet``) holds one row per
operation of a Megatron-style job: ``dp_rank``, ``stage``, ``step``, ``optype``, ``start_ts``,
``duration`` (seconds), ``seq_id`` (per type, step and worker). A *worker* (one data-parallel x
pipeline position; tensor-parallel peers are one) becomes a lane. Synchronisation points:

* pipeline transfers: the k-th ``forward-send`` of stage s with the k-th ``forward-recv`` of
  stage s+1 (same ``dp_rank``), ``backward-send`` of s with ``backward-recv`` of s-1;
* ``params-all-gather`` / ``grads-reduce-scatter``: one stage's data-parallel group;
* ``embedding-grads-all-reduce``: the first and last stage of one pipeline;
* ``optimizer-clip-main-grad``: every worker (the gradient-norm all-reduce);

and transfers a worker runs concurrently (a batched send+recv) merge into one sync. Everything
else (compute, optimizer, gc, the tensor-parallel layernorm all-reduce) is local work, with its
operation type as label; the gap before an operation (launch delay, unrecorded host work) is a
``host-gap`` item. The artifact's steps are unrelated samples, so each replays from time 0.

Ideal (the artifact's definition): compute items at their type's mean duration over the job,
transfers at their type's median, host gaps at 0.

Why an importer in the product, not a converter in benchmarks/: the artifact's trace format is a
documented, public op-level format from a production system; reading it lets a user check the
replay against published results, and tests pin those results.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from kinetoscope.diagnosis.whatif.build import Items, JobInfo, Visits, assemble
from kinetoscope.diagnosis.whatif.model import ReplayModel
from kinetoscope.diagnosis.whatif.search import Scenario, WhatIf

REQUIRED = ("dp_rank", "stage", "step", "optype", "start_ts", "duration", "seq_id")
P2P = ("forward-send", "forward-recv", "backward-send", "backward-recv")
DP_GROUP = ("params-all-gather", "grads-reduce-scatter", "separate-grads-all-reduce")
PIPELINE_ENDS = ("embedding-grads-all-reduce",)
ALL_WORKERS = ("optimizer-clip-main-grad",)
HOST_GAP = "host-gap"
STEP_END = "step-end"
_OVERLAP_EPS = 1e-6  # seconds: two transfers overlap when one starts before the other ends


class ArtifactError(ValueError):
    """The file is not an artifact trace (message names the file and the field)."""


@dataclass(frozen=True)
class ArtifactJob:
    """An imported artifact job: the model plus the lanes' data-parallel ranks and stages."""

    model: ReplayModel
    lane_dp: np.ndarray
    lane_stage: np.ndarray
    n_stages: int


def read_trace(path: Path) -> pl.DataFrame:
    """Read and check the Parquet file; one-line errors name the file and the missing field."""
    try:
        df = pl.read_parquet(path)
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise ArtifactError(f"{path}: not a readable Parquet file ({exc})") from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ArtifactError(f"{path}: missing column(s) {', '.join(missing)}")
    return df.select(
        pl.col("dp_rank").cast(pl.Int64),
        pl.col("stage").cast(pl.Int64),
        pl.col("step").cast(pl.Int64),
        pl.col("optype").cast(pl.String),
        pl.col("start_ts").cast(pl.Float64),
        pl.col("duration").cast(pl.Float64),
        pl.col("seq_id").cast(pl.Int64),
    )


def _group_keys(df: pl.DataFrame) -> pl.DataFrame:
    """A string key per transfer naming its sync before merging; null for local work."""
    o = pl.col("optype")
    ordinal = (pl.col("start_ts").rank("ordinal").over("step", "dp_rank", "stage", "optype")).cast(pl.Int64)
    sender = (
        pl.when(o == "forward-recv")
        .then(pl.col("stage") - 1)
        .when(o == "backward-recv")
        .then(pl.col("stage") + 1)
        .otherwise(pl.col("stage"))
    )
    direction = pl.when(o.str.starts_with("forward")).then(pl.lit("f")).otherwise(pl.lit("b"))
    s = pl.format
    key = (
        pl.when(o.is_in(P2P))
        .then(s("p2p{}/{}/{}/{}/{}", direction, "step", "dp_rank", sender, ordinal))
        .when(o.is_in(DP_GROUP))
        .then(s("{}/{}/{}/{}", o, "step", "stage", "seq_id"))
        .when(o.is_in(PIPELINE_ENDS))
        .then(s("{}/{}/{}/{}", o, "step", "dp_rank", "seq_id"))
        .when(o.is_in(ALL_WORKERS))
        .then(s("{}/{}/{}", o, "step", "seq_id"))
        .otherwise(None)
    )
    return df.with_columns(key.alias("gkey"))


class _Union:
    """Union-find over dense codes (merging transfers a worker runs at once)."""

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def load(path: Path, with_gaps: bool = False) -> ArtifactJob:
    """Import an artifact trace. ``with_gaps``: keep host gaps and negative transfers (a
    member leaving a transfer before its peer's arrival, clock noise) so that the replay
    reproduces the trace's own step times; the artifact's what-if figures are computed without
    host gaps and with negative transfers set to 0, as here by default."""
    df = read_trace(path)
    n_stages = int(df["stage"].max()) + 1  # type: ignore[arg-type]
    df = df.with_columns(
        (pl.col("dp_rank") * n_stages + pl.col("stage")).alias("lane"),
        pl.col("step").rank("dense").cast(pl.Int64).sub(1).alias("si"),
        (pl.col("start_ts") - pl.col("start_ts").min().over("step")).alias("t"),
    ).with_columns((pl.col("t") + pl.col("duration")).alias("e"))
    df = _group_keys(df).sort("si", "lane", "t", "seq_id", "optype")
    codes = df["gkey"].cast(pl.Categorical).to_physical().fill_null(-1).to_numpy()
    return _walk(df, codes.astype(np.int64), n_stages, with_gaps)


def _walk(df: pl.DataFrame, gcode: np.ndarray, n_stages: int, with_gaps: bool) -> ArtifactJob:
    """Walk every lane's chain once: merge concurrent transfers, emit visits and items."""
    lane = df["lane"].to_numpy()
    step = df["si"].to_numpy()
    t = df["t"].to_numpy()
    e = df["e"].to_numpy()
    optype = df["optype"].to_list()
    uf = _Union(int(gcode.max()) + 1 if gcode.size else 0)
    prev_i = -1
    for i in range(len(optype)):  # merge overlapping transfers of one lane
        if gcode[i] < 0:
            continue
        if prev_i >= 0 and lane[prev_i] == lane[i] and step[prev_i] == step[i]:
            if t[i] < e[prev_i] - _OVERLAP_EPS:
                uf.union(int(gcode[prev_i]), int(gcode[i]))
        prev_i = i
    labels: dict[str, int] = {HOST_GAP: 0, STEP_END: 1}
    b = _Builder(labels)
    i, n = 0, len(optype)
    while i < n:
        j = i
        while j < n and lane[j] == lane[i] and step[j] == step[i]:
            j += 1
        b.chain(int(lane[i]), int(step[i]), t[i:j], e[i:j], optype[i:j], gcode[i:j], uf, with_gaps)
        i = j
    n_lanes = int(lane.max()) + 1
    n_steps = int(step.max()) + 1
    obs = df.group_by("si").agg(pl.col("e").max()).sort("si")["e"].to_numpy()
    lane_ids = np.arange(n_lanes)
    job = b.finish(n_lanes, n_steps, obs, n_stages, clip_transfer=not with_gaps)
    return ArtifactJob(
        model=job,
        lane_dp=lane_ids // n_stages,
        lane_stage=lane_ids % n_stages,
        n_stages=n_stages,
    )


class _Builder:
    """Accumulates visits and items while walking the chains."""

    def __init__(self, labels: dict[str, int]) -> None:
        self.labels = labels
        self.sync_of_root: dict[int, int] = {}
        self.sync_label: list[int] = []
        self.sync_is_end: list[bool] = []
        self.v: dict[str, list[float]] = {k: [] for k in ("lane", "step", "chain", "sync", "a", "f")}
        self.it: dict[str, list[float]] = {k: [] for k in ("visit", "label", "work")}

    def _label(self, name: str) -> int:
        return self.labels.setdefault(name, len(self.labels))

    def _new_sync(self, label: int, is_end: bool) -> int:
        self.sync_label.append(label)
        self.sync_is_end.append(is_end)
        return len(self.sync_label) - 1

    def _visit(self, lane: int, step: int, pos: int, sync: int, a: float, f: float) -> int:
        for k, val in zip(self.v, (lane, step, pos, sync, a, f), strict=True):
            self.v[k].append(val)
        return len(self.v["lane"]) - 1

    def _item(self, visit: int, label: int, work: float) -> None:
        for k, val in zip(self.it, (visit, label, work), strict=True):
            self.it[k].append(val)

    def chain(
        self,
        lane: int,
        step: int,
        t: np.ndarray,
        e: np.ndarray,
        optype: list[str],
        gcode: np.ndarray,
        uf: _Union,
        with_gaps: bool,
    ) -> None:
        """One lane's step: local ops become items, merged transfers become visits."""
        pending: list[tuple[int, float]] = []
        cursor, pos, cur_root, cur_visit = 0.0, 0, -1, -1
        for k in range(len(optype)):
            gap = float(t[k] - cursor) if with_gaps else 0.0
            if gcode[k] < 0:
                pending += [(0, gap), (self._label(optype[k]), float(e[k] - t[k]))]
                cursor = max(cursor, float(e[k]))
                cur_root = -1
                continue
            root = uf.find(int(gcode[k]))
            if root == cur_root:  # same merged transfer: extend the visit
                self.v["f"][cur_visit] = max(self.v["f"][cur_visit], float(e[k]))
                cursor = max(cursor, float(e[k]))
                continue
            if root not in self.sync_of_root:
                self.sync_of_root[root] = self._new_sync(self._label(optype[k]), False)
            pending.append((0, gap))
            cur_visit = self._visit(lane, step, pos, self.sync_of_root[root], float(t[k]), float(e[k]))
            for lab, w in pending:
                self._item(cur_visit, lab, w)
            pending, pos, cur_root = [], pos + 1, root
            cursor = max(cursor, float(e[k]))
        end = self._visit(lane, step, pos, self._new_sync(self.labels[STEP_END], True), cursor, cursor)
        for lab, w in pending:
            self._item(end, lab, w)

    def finish(
        self, n_lanes: int, n_steps: int, obs: np.ndarray, n_stages: int, clip_transfer: bool = True
    ) -> ReplayModel:
        """Assemble the model with the artifact's ideal (type mean; host gaps 0)."""
        v, it = self.v, self.it
        label = np.asarray(it["label"], dtype=np.int64)
        work = np.asarray(it["work"], dtype=np.float64)
        sums = np.bincount(label, weights=work, minlength=len(self.labels))
        counts = np.maximum(np.bincount(label, minlength=len(self.labels)), 1)
        ideal = (sums / counts)[label]
        ideal[label == self.labels[HOST_GAP]] = 0.0
        names = tuple(sorted(self.labels, key=self.labels.__getitem__))
        visits = Visits(
            lane=np.asarray(v["lane"], dtype=np.int64),
            step=np.asarray(v["step"], dtype=np.int64),
            chain=np.asarray(v["chain"], dtype=np.int64),
            sync=np.asarray(v["sync"], dtype=np.int64),
            arrival=np.asarray(v["a"], dtype=np.float64),
            finish=np.asarray(v["f"], dtype=np.float64),
        )
        items = Items(np.asarray(it["visit"], dtype=np.int64), label, work, ideal)
        lanes = np.arange(n_lanes)
        info = JobInfo(
            n_lanes=n_lanes,
            n_steps=n_steps,
            independent_steps=True,
            clip_transfer=clip_transfer,
            labels=names,
            sync_label=np.asarray(self.sync_label, dtype=np.int64),
            sync_is_end=np.asarray(self.sync_is_end, dtype=bool),
            lane_name=tuple(
                f"dp{d}/stage{s}" for d, s in zip(lanes // n_stages, lanes % n_stages, strict=True)
            ),
            lane_stage=(lanes % n_stages).astype(np.int64),
            observed_step_time=np.asarray(obs, dtype=np.float64),
        )
        return assemble(visits, items, info)


@dataclass(frozen=True)
class ArtifactFigures:
    """The artifact's headline figures, computed by our replay (see ``search`` for terms)."""

    t_obs: float
    t_ideal: float
    slowdown: float
    m_w: float
    m_s: float
    worst_workers: tuple[str, ...]  # the top 3 % by own cost S_w, the set M_W removes
    worst_stage: int  # stage with the highest own cost S_w (all its workers observed)
    stage_cost: tuple[float, ...]  # per stage: S_w - 1


def figures(job: ArtifactJob) -> ArtifactFigures:
    """Slowdown, M_W (top 3 % workers by S_w removed) and M_S (last stage removed)."""
    w = WhatIf(job.model)
    lanes = list(range(job.model.n_lanes))
    t_ideal = float(w.t_ideal.mean())
    s_w = w.per_lane_add(lanes, with_transfer=True).mean(axis=1) / t_ideal
    k = max(1, int(np.ceil(len(lanes) * 3 / 100)))
    worst = [int(x) for x in np.argsort(-s_w, kind="stable")[:k]]
    stages = [[ln for ln in lanes if job.lane_stage[ln] == s] for s in range(job.n_stages)]
    stage_t = w.run([Scenario(True, *w.selection(st, True)) for st in stages]).mean(axis=1) / t_ideal
    rem, _ = w.removal([w.selection(worst, True), w.selection(stages[-1], True)])
    return ArtifactFigures(
        t_obs=float(w.t_obs.mean()),
        t_ideal=t_ideal,
        slowdown=w.slowdown,
        m_w=float(rem[0]),
        m_s=float(rem[1]),
        worst_workers=tuple(job.model.lane_name[x] for x in worst),
        worst_stage=int(np.argmax(stage_t)),
        stage_cost=tuple(float(x - 1.0) for x in stage_t),
    )
