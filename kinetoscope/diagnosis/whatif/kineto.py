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

The last step's tails are nobody's (``ReplayModel.item_unattributed``: their ideal is what was
observed, so no what-if changes them): no synchronisation in the trace follows them, so whether
a long one would have delayed anyone is not observed. They are also where the profiler's own
stop lands: once a rank's collection ends, its trace processing competes for the host's cores
with ranks still finishing that step (on a host the ranks share, a rank's last tail runs long
several times as often as its others).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl

from kinetoscope.diagnosis.stage_order import hop_stages
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
    compute: pl.DataFrame | None = None,
    compute_spans: pl.DataFrame | None = None,
) -> ReplayModel | None:
    """The model over the steps both tables hold for every rank; ``None`` when fewer than two
    ranks or no shared collective. ``instances``: rank, instance, coll, step, arrival, end (ns);
    ``steps``: rank, step, start, end (ns); ``asynchronous``: arrivals are host issue times of
    collectives the rank does not wait for (gloo), see ``model`` (asynchronous visit), except
    those ``instances.waited`` marks (a synchronous call: the rank waited for its end);
    ``links``: pipeline transfers (``whatif.p2p``: rank, instance, arrival, end, is_send), each
    a sync of its two ranks (a gloo send is asynchronous, a receive waits); ``compute``: rank,
    step, compute (ns): each rank's compute per step (``breakdown``), the yardstick of a
    pipeline rank's work (``lane_busy``); ``compute_spans``: rank, start, end (ns, aligned): each
    pipeline rank's compute intervals, disjoint, which split its work into compute and host gap
    (``ReplayModel.item_compute``). The replay covers the steps of ``instances`` (those
    the verdict reads) that every rank's span holds; with ``links``, sendrecv instances are left
    out (each transfer is its link). On a host-issued job neither compute table is read: a CPU
    rank's work is all its time outside waits, of which its ops are only part."""
    inst = instances.filter(pl.col("step").is_not_null())
    analysed = inst["step"].unique().to_list()  # the steps the verdict reads: the replay's too
    paired = links is not None and links.height > 0
    if paired:  # each transfer is its link: a sendrecv instance matched by ordinal would pair it twice
        inst = inst.filter(pl.col("coll") != "sendrecv")
    waited = pl.col("waited").fill_null(False) if "waited" in inst.columns else pl.lit(False)
    inst = inst.select(
        "rank",
        "instance",
        "step",
        "arrival",
        "end",
        pl.lit(asynchronous).alias("_async"),
        (pl.lit(asynchronous) & waited).alias("_waited"),
    )
    if links is not None and paired:
        transfers = _link_rows(links, steps, asynchronous).filter(pl.col("step").is_in(analysed))
        inst = pl.concat([inst, transfers], how="vertical_relaxed")
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
    if asynchronous:  # host-issued (CPU): the host is the device, and all its time outside the
        compute = compute_spans = None  # waits is work (sleeps, Python, loading are no ops)
    return _assemble(inst, per, ranks, step_ids, compute, compute_spans)


def _link_rows(links: pl.DataFrame, steps: pl.DataFrame, asynchronous: bool) -> pl.DataFrame:
    """Transfers as instance rows with the step of the rank's span holding their arrival. A
    host-issued send is asynchronous, and waited for when its rank's thread waited for it to end
    (``p2p.LINK_SCHEMA`` ``waited``: a pipeline schedule waits for its sends before it goes on,
    so a stage whose neighbour is slow to receive waits, and does not work, in that time)."""
    spans = steps.select("rank", "step", pl.col("start").alias("_s"), pl.col("end").alias("_e")).sort("_s")
    rows = (
        links.sort("arrival")
        .join_asof(
            spans, left_on="arrival", right_on="_s", by="rank", strategy="backward", check_sortedness=False
        )
        .filter(pl.col("step").is_not_null() & (pl.col("arrival") < pl.col("_e")))
    )
    whole = rows.group_by("instance").agg(pl.len().alias("_n")).filter(pl.col("_n") == 2).select("instance")
    sent_async = pl.col("is_send") & pl.lit(asynchronous)
    return rows.join(whole, on="instance").select(
        "rank",
        "instance",
        "step",
        "arrival",
        "end",
        sent_async.alias("_async"),
        (sent_async & pl.col("waited").fill_null(False)).alias("_waited"),
    )


def _assemble(
    inst: pl.DataFrame,
    per: pl.DataFrame,
    ranks: list[int],
    step_ids: list[int],
    compute: pl.DataFrame | None,
    compute_spans: pl.DataFrame | None = None,
) -> ReplayModel:
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
            ends.with_columns(
                pl.lit(False).alias("_async"), pl.lit(False).alias("_waited"), pl.lit(True).alias("is_end")
            ),
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
        pl.when((pl.col("async") & ~pl.col("_waited")).shift(1).over("lane"))
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
    ideal = typical(work, group, how="lower")
    stage = np.zeros(len(ranks), dtype=np.int64)
    busy = replica = in_compute = None
    if rows["instance"].str.starts_with("p2p@").any():  # ... or, in a pipeline, the peer class
        busy = lane_busy(rows, per, lane_of, step_of, compute)  # the stages' yardstick: compute
        ideal, cls = peer_ideal(rows, work, group, lane_busy(rows, per, lane_of, step_of))
        stage = pipeline_stages(rows, cls)
        replica = pipeline_replicas(rows, len(ranks))
        if compute_spans is not None and compute_spans.height:
            lanes = rows["lane"].to_numpy()
            in_compute = window_compute(
                lanes, a - np.maximum(work, 0.0), a, _lane_spans(compute_spans, lane_of, origin)
            )
    visits = Visits(
        lane=rows["lane"].to_numpy(),
        step=si,
        chain=rows["chain"].to_numpy(),
        sync=sync,
        arrival=np.where(asy, np.maximum(a, prev_f), a),
        finish=rows["f"].to_numpy(),
        is_async=asy,
        waited=rows["_waited"].to_numpy(),
    )
    label = is_end.astype(np.int64)
    items = Items(np.arange(work.shape[0]), label, work, ideal, in_compute)
    step_end = per.group_by("step").agg(pl.col("end").max()).sort("step")["end"].to_numpy() - origin
    info = JobInfo(
        n_lanes=len(ranks),
        n_steps=len(step_ids),
        independent_steps=False,
        labels=(BETWEEN, TAIL),
        sync_label=sync_is_end.astype(np.int64),
        sync_is_end=sync_is_end,
        lane_name=tuple(str(r) for r in ranks),
        lane_stage=stage,
        observed_step_time=np.diff(step_end.astype(np.float64), prepend=0.0),
        ideal_transfer_by_sync=True,
        clip_transfer=False,
        lane_busy=busy,
        lane_replica=replica,
    )
    model = assemble(visits, items, info)
    return dataclasses.replace(
        model, item_ideal=np.where(model.item_unattributed, model.item_work, model.item_ideal)
    )


def _lane_spans(spans: pl.DataFrame, lane_of: dict[int, int], origin: int) -> pl.DataFrame:
    """``compute_spans`` of the model's ranks as lane, start, end on the model's clock."""
    return spans.filter(pl.col("rank").is_in(list(lane_of))).select(
        pl.col("rank").replace_strict(lane_of, return_dtype=pl.Int64).alias("lane"),
        (pl.col("start") - origin).cast(pl.Float64).alias("start"),
        (pl.col("end") - origin).cast(pl.Float64).alias("end"),
    )


def window_compute(lane: np.ndarray, lo: np.ndarray, hi: np.ndarray, spans: pl.DataFrame) -> np.ndarray:
    """Per window ``[lo, hi]`` of ``lane``: the compute inside it. ``spans``: lane, start, end,
    disjoint within a lane. One search over all lanes: each lane's times are moved to its own
    stretch of one axis, and the compute before a time is a running sum."""
    if not spans.height or lane.size == 0:
        return np.zeros(lane.shape[0])
    sp = spans.sort("lane", "start")
    s_lane = sp["lane"].to_numpy()
    low = min(float(sp["start"].min()), float(lo.min()))  # type: ignore[arg-type]
    stride = max(float(sp["end"].max()), float(hi.max())) - low + 1.0  # type: ignore[arg-type]
    start = s_lane * stride + (sp["start"].to_numpy() - low)
    length = sp["end"].to_numpy() - sp["start"].to_numpy()
    before = np.r_[0.0, np.cumsum(length)[:-1]]

    def upto(t: np.ndarray) -> np.ndarray:
        key = lane * stride + (t - low)
        j = np.searchsorted(start, key, side="right") - 1
        jj = np.maximum(j, 0)
        inside = np.clip(key - start[jj], 0.0, length[jj])
        return np.asarray(np.where(j >= 0, before[jj] + inside, 0.0), dtype=np.float64)

    return np.asarray(np.clip(upto(hi) - upto(lo), 0.0, np.maximum(hi - lo, 0.0)), dtype=np.float64)


def lane_busy(
    rows: pl.DataFrame,
    per: pl.DataFrame,
    lane_of: dict[int, int],
    step_of: dict[int, int],
    compute: pl.DataFrame | None = None,
) -> np.ndarray:
    """Per lane and step (lanes x steps): how long the lane worked, robust to the order of
    overlapping visits (unlike the work before each visit): its compute (``compute``: rank,
    step, compute in ns) where known and positive, else the step's duration minus the union
    of its blocking visits (arrival to end: a synchronous one, or an asynchronous one the lane
    then waited for), which also counts waits no visit records (a wait before a collective is
    issued). ``rows`` as in ``_assemble``; ``per``: step spans."""
    v = (
        rows.filter(~pl.col("is_end") & (~pl.col("async") | pl.col("_waited")))
        .select("lane", "si", "a", "f")
        .sort("lane", "si", "a")
    )
    v = v.with_columns(pl.col("f").cum_max().shift(1).over("lane", "si").alias("_reach"))
    v = v.with_columns(
        (pl.col("f") - pl.max_horizontal("a", pl.col("_reach").fill_null(-np.inf)))
        .clip(lower_bound=0.0)
        .alias("_u")
    )
    held = v.group_by("lane", "si").agg(pl.col("_u").sum())
    out = np.zeros((len(lane_of), len(step_of)))
    span = per.select(
        pl.col("rank").replace_strict(lane_of, return_dtype=pl.Int64).alias("lane"),
        pl.col("step").replace_strict(step_of, return_dtype=pl.Int64).alias("si"),
        (pl.col("end") - pl.col("start")).cast(pl.Float64).alias("_d"),
    )
    out[span["lane"].to_numpy(), span["si"].to_numpy()] = span["_d"].to_numpy()
    out[held["lane"].to_numpy(), held["si"].to_numpy()] -= held["_u"].to_numpy()
    out = np.maximum(out, 0.0)
    if compute is not None and compute.height:
        c = compute.filter(pl.col("rank").is_in(list(lane_of)) & pl.col("step").is_in(list(step_of)))
        lanes = c["rank"].replace_strict(lane_of, return_dtype=pl.Int64).to_numpy()
        sis = c["step"].replace_strict(step_of, return_dtype=pl.Int64).to_numpy()
        val = c["compute"].cast(pl.Float64).to_numpy()
        ok = val > 0
        out[lanes[ok], sis[ok]] = val[ok]
    return out


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


def _visit_tokens(rows: pl.DataFrame) -> tuple[list[int], list[int], list[str], list[int | None]]:
    """Per visit (rows in each lane's time order): lane, step, token (``_token``) and the
    transfer peer's lane (None for collectives and step ends)."""
    lanes = rows["lane"].to_list()
    ranks = rows["rank"].to_list()
    lane_of_rank = dict(zip(ranks, lanes, strict=True))
    toks: list[str] = []
    peers: list[int | None] = []
    for rank, inst, end in zip(ranks, rows["instance"].to_list(), rows["is_end"].to_list(), strict=True):
        tok = _token(inst, end, rank)
        toks.append(tok)
        peer = None
        if tok in ("send", "recv"):
            a, b = inst[4:].split("#", 1)[0].split(">", 1)
            peer = lane_of_rank.get(int(b) if tok == "send" else int(a))
        peers.append(peer)
    return lanes, rows["si"].to_list(), toks, peers


def peer_classes(rows: pl.DataFrame) -> list[int]:
    """Per lane, its *peer class*: the lanes doing the same work, i.e. the replicas of its stage.

    Signature of a lane, per step: which step opens with a send (stage 0 holds the input), and
    how many visits of each *channel* it makes: a collective type and group size, or sends and
    receives with a peer of a given class. Counts, not order: the replicas of one stage may visit
    overlapping-stream events (a batched send+recv, collectives on other streams) in different
    orders. Refined by the peers' classes until stable (the stages of a pipeline differ by their
    neighbours). Transfers left unpaired (read as ``sendrecv`` collectives) are not counted.
    ``rows``: lane, rank, instance, is_end, si in each lane's time order."""
    lanes, steps, toks, peers = _visit_tokens(rows)
    n = max(lanes) + 1 if lanes else 0
    cls = [0] * n
    for _ in range(8):
        sig: dict[int, dict[tuple[int, str, int], int]] = {lane: {} for lane in set(lanes)}
        opens: dict[int, dict[int, str]] = {lane: {} for lane in set(lanes)}
        for lane, si, tok, peer in zip(lanes, steps, toks, peers, strict=True):
            if tok.startswith("sendrecv/"):  # a transfer left unpaired, not the stage's work
                continue
            key = (si, tok, cls[peer] if peer is not None else -1)
            sig[lane][key] = sig[lane].get(key, 0) + 1
            if peer is not None:
                opens[lane].setdefault(si, tok)
        full = {lane: (tuple(sorted(sig[lane].items())), tuple(sorted(opens[lane].items()))) for lane in sig}
        ids: dict[object, int] = {}
        new = [ids.setdefault(full[lane], len(ids)) if lane in full else -1 for lane in range(n)]
        if new == cls:
            break
        cls = new
    return cls


def peer_ideal(
    rows: pl.DataFrame, work: np.ndarray, fallback: np.ndarray, busy: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The ideal local work of each visit on a pipeline job, and the lanes' peer classes.

    A lane's step is compared with the same step of its peer class (``peer_classes``: the
    replicas of its stage) as a whole: each visit's work is scaled by the class's typical busy
    time in the step (lower median over the class's lanes of ``busy``: ``lane_busy`` without
    compute, i.e. all the time the replay counts as work, a sleep or a slow data loader too)
    over the lane's own. Not visit by visit: the replicas of a stage visit overlapping events in different
    orders, and the work before a visit then differs in meaning between replicas (the lower of
    two at each position loses the compute between them). Only positive work is scaled: a
    negative one is an overlap (a visit issued before the previous one finished, a batched
    send+recv) and stays as observed, so the ideal keeps the overlap. A lane alone in its class
    (or not busy in the step) keeps the lower median over its sync's members (``fallback``
    groups), at 0 or more where it worked."""
    cls = np.asarray(peer_classes(rows), dtype=np.int64)
    n_lanes, n_steps = busy.shape
    lane_cls = np.full(n_lanes, -1, dtype=np.int64)
    lane_cls[: cls.shape[0]] = cls[:n_lanes]
    known = lane_cls >= 0
    ratio = np.ones_like(busy)
    if known.any():
        cell_group = (np.maximum(lane_cls, 0)[:, None] * n_steps + np.arange(n_steps)[None, :]).ravel()
        typ = typical(busy.ravel(), cell_group, how="lower").reshape(busy.shape)
        size = np.bincount(lane_cls[known])
        good = known[:, None] & (size[np.maximum(lane_cls, 0)] >= 2)[:, None] & (busy > 0)
        ratio = np.where(good, typ / np.where(good, busy, 1.0), np.nan)
    lane = rows["lane"].to_numpy()
    r = ratio[lane, rows["si"].to_numpy()]
    lone = np.maximum(typical(work, fallback, how="lower"), 0.0)
    ideal = np.where(work > 0, np.where(np.isnan(r), lone, work * np.nan_to_num(r, nan=1.0)), work)
    return ideal, cls


def pipeline_stages(rows: pl.DataFrame, cls: np.ndarray) -> np.ndarray:
    """Per lane, its pipeline stage: 0 for the peer classes whose lanes open their steps with a
    send (stage 0 holds the input), then the hops along the transfers between peer classes;
    all 0 when the classes do not form such a chain (no stages: ``m_s`` is not computed)."""
    lanes, _, toks, peers = _visit_tokens(rows)
    n = cls.shape[0]
    first: dict[int, str] = {}
    near: dict[int, set[int]] = {}
    for lane, tok, peer in zip(lanes, toks, peers, strict=True):
        if peer is None:
            continue
        first.setdefault(lane, tok)
        near.setdefault(int(cls[lane]), set()).add(int(cls[peer]))
    heads = {int(cls[lane]) for lane, tok in first.items() if tok == "send"}
    stage_of = hop_stages(heads, near)  # the one stage order (``diagnosis.stage_order``)
    per_lane = np.asarray([stage_of.get(int(c), -1) for c in cls], dtype=np.int64)
    if len(heads) != 1 or (per_lane < 0).any() or n == 0:
        return np.zeros(n, dtype=np.int64)
    return per_lane


def pipeline_replicas(rows: pl.DataFrame, n_lanes: int) -> np.ndarray:
    """Per lane, its pipeline replica: the lanes joined by transfers (one per stage), numbered
    by their lowest lane; -1 for a lane without transfers."""
    lanes, _, _, peers = _visit_tokens(rows)
    parent = list(range(n_lanes))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    linked: set[int] = set()
    for lane, peer in zip(lanes, peers, strict=True):
        if peer is not None:
            linked.update((lane, peer))
            a, b = find(lane), find(peer)
            if a != b:
                parent[max(a, b)] = min(a, b)
    return np.asarray([find(x) if x in linked else -1 for x in range(n_lanes)], dtype=np.int64)
