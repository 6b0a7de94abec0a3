"""Replay model of a Kineto job from the diagnosis' aligned collective instances.

Lanes are ranks. Every collective instance (``breakdown.instance_table``: each rank's aligned
arrival and end) is a synchronisation point whose members are the ranks holding it, so once the
instances are keyed per process group, matching stays within the group. A rank's step end
(ProfilerStep / optimizer delimiters, aligned) is a one-member sync. The local work before a
visit is the time from the rank's previous visit's end to its arrival: compute, data loading,
host gaps; before a step end it is the step's tail (optimizer, next batch). Its ideal is the
typical member's (lower median over the sync's members, as the typical arrival of the
attribution: of two ranks, the faster; over the ranks for step tails), and so is a
member's transfer (the time it spends in the collective after the last arrival).

Pipeline jobs: each transfer paired with its peer (``whatif.p2p``) is a sync of its two ranks,
so a stage that waited for a slowed upstream worker is seen to wait, not to work. There a
collective's or a transfer's members are no yardstick (a tensor-parallel group slowed together,
two different stages), so the typical work of a visit is the lower median over the same visit
of the rank's *peer class* (``peer_classes``: the ranks doing the same sequence of visits with
neighbours of the same classes, i.e. the replicas of its stage).

Asynchronous collectives (gloo buckets issued without waiting) make that time negative; the
replay still reproduces the timeline, and a late arrival still delays what follows it. A member
that leaves a collective before its last member's arrival (host issue times, clock residuals)
keeps that negative transfer, so the unmodified replay reproduces every end.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from kinetoscope.diagnosis.whatif.build import Items, JobInfo, Visits, assemble
from kinetoscope.diagnosis.whatif.model import ReplayModel, typical

BETWEEN = "between-collectives"
TAIL = "step-tail"
_END_KEY = "__step_end__"


def model_from_instances(
    instances: pl.DataFrame,
    steps: pl.DataFrame,
    asynchronous: bool = False,
    links: pl.DataFrame | None = None,
) -> ReplayModel | None:
    """The model over the steps both tables hold for every rank; ``None`` when fewer than two
    ranks or no shared collective. ``instances``: rank, instance, step, arrival, end (ns);
    ``steps``: rank, step, start, end (ns); ``asynchronous``: arrivals are host issue times of
    collectives the rank does not wait for (gloo), see ``model`` (asynchronous visit);
    ``links``: pipeline transfers (``whatif.p2p``: rank, instance, arrival, end, is_send), each
    a sync of its two ranks (a gloo send is asynchronous, a receive waits)."""
    inst = instances.filter(pl.col("step").is_not_null()).select("rank", "instance", "step", "arrival", "end")
    inst = inst.with_columns(pl.lit(asynchronous).alias("_async"))
    if links is not None and links.height:
        inst = pl.concat([inst, _link_rows(links, steps, asynchronous)], how="vertical_relaxed")
    multi = inst.group_by("instance").agg(pl.len().alias("_n")).filter(pl.col("_n") > 1)
    inst = inst.join(multi.select("instance"), on="instance")
    ranks = sorted(set(inst["rank"].to_list()) & set(steps["rank"].to_list()))
    if len(ranks) < 2:
        return None
    step_ids = sorted(set(inst["step"].to_list()) & set(steps["step"].to_list()))
    per = steps.filter(pl.col("rank").is_in(ranks) & pl.col("step").is_in(step_ids))
    full = per.group_by("step").agg(pl.col("rank").n_unique().alias("_n")).filter(pl.col("_n") == len(ranks))
    step_ids = sorted(full["step"].to_list())
    if not step_ids:
        return None
    per = per.filter(pl.col("step").is_in(step_ids))
    inst = inst.filter(pl.col("step").is_in(step_ids) & pl.col("rank").is_in(ranks))
    return _assemble(inst, per, ranks, step_ids)


def _link_rows(links: pl.DataFrame, steps: pl.DataFrame, asynchronous: bool) -> pl.DataFrame:
    """Transfers as instance rows with the step of the rank's span holding their arrival."""
    spans = steps.select("rank", "step", pl.col("start").alias("_s"), pl.col("end").alias("_e")).sort("_s")
    rows = (
        links.sort("arrival")
        .join_asof(
            spans, left_on="arrival", right_on="_s", by="rank", strategy="backward", check_sortedness=False
        )
        .filter(pl.col("step").is_not_null() & (pl.col("arrival") < pl.col("_e")))
    )
    whole = rows.group_by("instance").agg(pl.len().alias("_n")).filter(pl.col("_n") == 2).select("instance")
    return rows.join(whole, on="instance").select(
        "rank",
        "instance",
        "step",
        "arrival",
        "end",
        (pl.col("is_send") & pl.lit(asynchronous)).alias("_async"),
    )


def _assemble(inst: pl.DataFrame, per: pl.DataFrame, ranks: list[int], step_ids: list[int]) -> ReplayModel:
    origin = int(per.group_by("rank").agg(pl.col("start").min())["start"].min())  # type: ignore[arg-type]
    ends = per.select(
        "rank",
        pl.format("{}#{}#{}", pl.lit(_END_KEY), "step", "rank").alias("instance"),
        "step",
        pl.col("end").alias("arrival"),
        "end",
    )
    rows = pl.concat(
        [
            inst.with_columns(pl.lit(False).alias("is_end")),
            ends.with_columns(pl.lit(False).alias("_async"), pl.lit(True).alias("is_end")),
        ]
    )
    lane_of = {r: i for i, r in enumerate(ranks)}
    step_of = {s: i for i, s in enumerate(step_ids)}
    rows = rows.with_columns(
        pl.col("rank").replace_strict(lane_of, return_dtype=pl.Int64).alias("lane"),
        pl.col("step").replace_strict(step_of, return_dtype=pl.Int64).alias("si"),
        (pl.col("arrival") - origin).cast(pl.Float64).alias("a"),
        (pl.col("end") - origin).cast(pl.Float64).alias("f"),
    ).sort("lane", "a", "is_end", "instance")
    is_async = (~pl.col("is_end")) & pl.col("_async")
    rows = rows.with_columns(is_async.alias("async")).with_columns(
        pl.col("f").shift(1).over("lane").fill_null(0.0).alias("prev_f"),
        pl.when(pl.col("async").shift(1).over("lane"))
        .then(pl.col("a").shift(1).over("lane"))
        .otherwise(pl.col("f").shift(1).over("lane"))
        .fill_null(0.0)
        .alias("prev_clock"),
        pl.int_range(pl.len()).over("lane").cast(pl.Int64).alias("chain"),
        pl.col("instance").cast(pl.Categorical).to_physical().cast(pl.Int64).alias("sync"),
    )
    sync = rows["sync"].to_numpy()
    is_end = rows["is_end"].to_numpy()
    n_syncs = int(sync.max()) + 1
    sync_is_end = np.zeros(n_syncs, dtype=bool)
    sync_is_end[sync[is_end]] = True
    si = rows["si"].to_numpy()
    a = rows["a"].to_numpy()
    prev_f = rows["prev_f"].to_numpy()
    prev_clock = rows["prev_clock"].to_numpy()
    asy = rows["async"].to_numpy()
    # asynchronous: issued after the lane's own previous issue; blocking: after waiting for the
    # previous collective too (a step's tail starts once the gradients are reduced)
    work = np.where(asy, a - prev_clock, a - np.maximum(prev_clock, prev_f))
    group = np.where(is_end, n_syncs + si, sync)  # the typical peer: the sync's members ...
    if rows["instance"].str.starts_with("p2p@").any():  # ... or, in a pipeline, the peer class
        group = peer_class_keys(rows, group)
    visits = Visits(
        lane=rows["lane"].to_numpy(),
        step=si,
        chain=rows["chain"].to_numpy(),
        sync=sync,
        arrival=np.where(asy, np.maximum(a, prev_f), a),
        finish=rows["f"].to_numpy(),
        is_async=asy,
    )
    label = is_end.astype(np.int64)
    items = Items(np.arange(work.shape[0]), label, work, typical(work, group, how="lower"))
    step_end = per.group_by("step").agg(pl.col("end").max()).sort("step")["end"].to_numpy() - origin
    info = JobInfo(
        n_lanes=len(ranks),
        n_steps=len(step_ids),
        independent_steps=False,
        labels=(BETWEEN, TAIL),
        sync_label=sync_is_end.astype(np.int64),
        sync_is_end=sync_is_end,
        lane_name=tuple(str(r) for r in ranks),
        lane_stage=np.zeros(len(ranks), dtype=np.int64),
        observed_step_time=np.diff(step_end.astype(np.float64), prepend=0.0),
        ideal_transfer_by_sync=True,
        clip_transfer=False,
    )
    return assemble(visits, items, info)


def _token(instance: str, is_end: bool, rank: int) -> str:
    """What a visit is, independent of which group or peer: type and group size, a transfer's
    direction, a step end."""
    if is_end:
        return "end"
    head = instance.split("#", 1)[0]
    if head.startswith("p2p@"):
        return "send" if head[4:].split(">", 1)[0] == str(rank) else "recv"
    coll, _, group = head.partition("@")
    return f"{coll}/{group.count(',') + 1 if group else '*'}"


def peer_classes(rows: pl.DataFrame) -> list[int]:
    """Per lane, its *peer class*: the lanes doing the same work, i.e. the same sequence of
    visits (types, group sizes, transfer directions), refined twice by the classes of their
    transfer peers (the stages of a pipeline differ by their neighbours even when their own
    sequences match). ``rows``: lane, rank, instance, is_end in each lane's time order."""
    lanes = rows["lane"].to_list()
    ranks = rows["rank"].to_list()
    insts = rows["instance"].to_list()
    ends = rows["is_end"].to_list()
    lane_of_rank = dict(zip(ranks, lanes, strict=True))
    seq: dict[int, list[tuple[str, int | None]]] = {}
    for lane, rank, inst, end in zip(lanes, ranks, insts, ends, strict=True):
        tok = _token(inst, end, rank)
        peer = None
        if tok in ("send", "recv"):
            a, b = inst[4:].split("#", 1)[0].split(">", 1)
            peer = lane_of_rank.get(int(b) if tok == "send" else int(a))
        seq.setdefault(lane, []).append((tok, peer))
    n = max(seq) + 1 if seq else 0
    cls = [0] * n
    for _ in range(3):
        sig = {lane: tuple((t, cls[p] if p is not None else -1) for t, p in s) for lane, s in seq.items()}
        ids: dict[tuple[tuple[str, int], ...], int] = {}
        cls = [ids.setdefault(sig[lane], len(ids)) if lane in sig else -1 for lane in range(n)]
    return cls


def peer_class_keys(rows: pl.DataFrame, fallback: np.ndarray) -> np.ndarray:
    """Codes of the typical-peer groups: a visit is compared with the same visit (same step,
    same position in the step) of the lanes of its peer class (``peer_classes``), so a
    collective's members are not the only yardstick (a tensor-parallel group slowed together, a
    transfer between two stages); a lane alone in its class keeps ``fallback`` (its sync's
    members)."""
    cls = np.asarray(peer_classes(rows), dtype=np.int64)
    lane = rows["lane"].to_numpy()
    c = cls[lane]
    size = np.bincount(cls[cls >= 0])
    pos = rows.select(pl.int_range(pl.len()).over("lane", "si").alias("pos"))["pos"].to_numpy()
    key = pl.DataFrame({"c": c, "si": rows["si"].to_numpy(), "pos": pos})
    code = key.select(pl.struct("c", "si", "pos").rank("dense"))["c"].to_numpy().astype(np.int64)
    shared = size[c] >= 2
    base = int(fallback.max(initial=0)) + 1
    return np.where(shared, base + code, fallback).astype(np.int64)
