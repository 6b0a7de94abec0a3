"""Stage imbalance of a pipeline job read off replays: ``M_S``, and ``M_W`` against the same ideal.

The straggler search compares a rank with the replicas of its stage (its peer class,
``whatif.kineto``), which cannot see a stage that is slow on every replica. Here the ideal is
also *stage-balanced*, as in *Understanding Stragglers in Large Model Training Using What-if
Analysis* (OSDI '25), whose ideal puts every operation at its type's mean over the job: every
stage does the mean stage's work. With ``W_s`` the typical compute of a lane of stage ``s`` per
step (median over the stage's lanes of ``ReplayModel.lane_busy``, so a slowed replica does not
move it), each lane's ideal work in a step sums to ``mean_s(W_s)``: the mean stage's compute.

* Where the work is split into compute and host gap (``splits_compute``: compute intervals
  known, every visit blocking), as in the artifact's what-ifs: host gaps are left out of both
  sides (a wait before a visit that no event records is then replayed as a wait at the sync);
  each visit's compute is at its visit type's mean share of the step, so what differs from one
  micro-batch or replica to the next (sequence lengths) is gone, and each transfer at its
  visit type's median (``_typed``).
* Otherwise (gloo pipelines: a window between the issue times of asynchronous sends holds
  compute of earlier work) each lane's work in a step is scaled as a whole: the ideal to the
  mean stage's compute; for ``m_w`` the observed side to the lane's own compute too.

Then (definitions as in ``whatif.search``):

``slowdown``
    ``T_obs / T_ideal`` against that ideal: stragglers and stage imbalance together.
``m_s``
    ``rem`` of the last stage (its ranks made ideal): above 1 when that stage was slower and
    the others faster than ideal; near 0 when the stages are balanced.
``m_w``
    ``rem`` of the worst 3 % of ranks (at least one) by own cost ``S_w``; ranks tied with the
    last of them (own cost within 0.8) count as one worker (tensor-parallel peers slowed
    together) unless they make up a whole stage (the replicas of a slow stage are the stage
    imbalance ``m_s`` measures, not a worker).
``stage`` / ``recovered``
    the stage with the highest own cost (the ideal job with only that stage observed) and the
    ``rem`` of that stage: the share of the slowdown balancing it recovers.
"""

from __future__ import annotations

import dataclasses

import msgspec
import numpy as np

from kinetoscope.diagnosis.whatif.model import F64, I64, ReplayModel, typical
from kinetoscope.diagnosis.whatif.search import Scenario, WhatIf, candidates
from kinetoscope.protocol.structinfo import prime_structs

EXPLAINS = 0.5  # the stage explains the slowdown when balancing it recovers half of it ...
NOT_A_WORKER = 0.5  # ... and fixing the worst workers recovers less than half
MIN_SLOWDOWN = 0.05  # ... of a slowdown of 5 % or more
WORKER_SHARE = 0.03  # M_W: the worst 3 % of ranks
TIE = 0.8  # ranks within this of the last of them are one worker


@dataclasses.dataclass(frozen=True)
class StageFigures:
    """The stage what-if of one job (module docstring); stages and lanes are indices."""

    slowdown: float
    m_s: float
    m_w: float | None
    stage: int
    recovered: float
    stage_lanes: tuple[tuple[int, ...], ...]  # lanes of each stage, stage 0 first
    stage_cost: tuple[float, ...]  # per stage: its own slowdown S - 1 on the balanced ideal


def stage_balanced(model: ReplayModel, gap_free: bool = False) -> ReplayModel | None:
    """The model with every lane's ideal work set to the mean stage's (module docstring) and,
    with ``gap_free`` (always where ``splits_compute``), its observed work to its own compute;
    ``None`` without two stages, without ``lane_busy`` or when a stage does no work."""
    stage = model.lane_stage
    n_stages = int(stage.max(initial=0)) + 1
    if n_stages < 2 or model.lane_busy is None:
        return None
    busy = model.lane_busy
    w_s = np.stack(
        [np.median(busy[stage == s], axis=0) if (stage == s).any() else busy[0] * 0 for s in range(n_stages)]
    )
    if (w_s <= 0).any():
        return None
    target = w_s.mean(axis=0)  # per step: the mean stage's compute
    if splits_compute(model):
        return _typed(model, target)
    lane = model.item_lane
    step = model.inc_step[model.item_inc]
    compute = model.lane_busy[lane, step]
    work = (
        _scaled_to(model.item_work, lane * model.n_steps + step, compute, model)
        if gap_free
        else model.item_work
    )
    if model.inc_async.any():  # work between issue times does not sum to compute: scale by the ratio
        ratio = target[step] / w_s[stage[lane], step]
        ideal = np.where(model.item_ideal > 0, model.item_ideal * ratio, model.item_ideal)
        work = model.item_work
    else:
        ideal = _scaled_to(model.item_ideal, lane * model.n_steps + step, target[step], model)
    return dataclasses.replace(model, item_work=work, item_ideal=ideal)


def splits_compute(model: ReplayModel) -> bool:
    """The model's work is split into compute and host gap (``ReplayModel.item_compute``) and
    every visit blocks: a window between the issue times of asynchronous visits (gloo) holds
    compute of work issued before it, so there the work is scaled to compute as a whole."""
    return model.item_compute is not None and not bool(model.inc_async.any())


def _typed(model: ReplayModel, target: F64) -> ReplayModel:
    """The stage-balanced model of a job whose work is split into compute and host gap
    (``ReplayModel.item_compute``), as the artifact's what-ifs define it: host gaps left out of
    both sides (a wait before a visit is then replayed as a wait at the sync), each visit's
    compute at its *visit type*'s mean share of the lane's step compute, scaled to the mean
    stage's compute, and each transfer at its visit type's median. A visit type is one position
    in the step of the lanes of one stage (``_visit_type``): the replicas of a stage, over the
    steps, visit the same sequence, so the mean removes what differs from one micro-batch or
    replica to the next (sequence lengths), as the artifact's type mean does. Negative items
    (overlaps) are kept on both sides."""
    positive = model.item_work > 0
    assert model.item_compute is not None
    compute = np.where(positive, model.item_compute, 0.0)
    step = model.inc_step[model.item_inc]
    cell = model.item_lane * model.n_steps + step
    n_cells = model.n_lanes * model.n_steps
    total = np.bincount(cell, weights=compute, minlength=n_cells)[cell]
    share = np.divide(compute, total, out=np.zeros_like(compute), where=total > 0)
    typ = typical(share, _visit_type(cell, model.lane_stage[model.item_lane]), how="mean")
    typ = np.where(positive, typ, 0.0)
    typ_total = np.bincount(cell, weights=typ, minlength=n_cells)[cell]
    ideal = np.divide(typ * target[step], typ_total, out=np.zeros_like(typ), where=typ_total > 0)
    inc_cell = model.inc_lane * model.n_steps + model.inc_step
    transfer = typical(model.inc_ideal_transfer, _visit_type(inc_cell, model.lane_stage[model.inc_lane]))
    return dataclasses.replace(
        model,
        item_work=np.where(positive, compute, model.item_work),
        item_ideal=np.where(positive, ideal, model.item_work),
        inc_ideal_transfer=transfer,
    )


def _visit_type(cell: I64, stage: I64) -> I64:
    """Per element (items or incidences, in each lane's time order within a cell = lane x
    step): a dense code of (its lane's stage, the cell's number of elements, its position in
    the cell). Lanes of one stage whose steps differ in length do not share types."""
    order = np.lexsort((np.arange(cell.size), cell))
    sorted_cell = cell[order]
    starts = np.flatnonzero(np.r_[True, sorted_cell[1:] != sorted_cell[:-1]])
    counts = np.diff(np.r_[starts, cell.size])
    pos = np.empty_like(cell)
    pos[order] = np.arange(cell.size) - np.repeat(starts, counts)
    size = np.empty_like(cell)
    size[order] = np.repeat(counts, counts)
    key = np.stack([stage, size, pos])
    _, code = np.unique(key, axis=1, return_inverse=True)
    return np.asarray(code.ravel(), dtype=np.int64)


def _scaled_to(values: F64, cell: I64, target: F64, model: ReplayModel) -> F64:
    """``values`` with each (lane, step) cell's positive items scaled to sum to ``target``
    (per item: its cell's); negative items (overlaps, not work) are kept."""
    busy = np.maximum(values, 0.0)
    total = np.bincount(cell, weights=busy, minlength=model.n_lanes * model.n_steps)[cell]
    factor = np.where(total > 0, target / np.where(total > 0, total, 1.0), 1.0)
    return np.asarray(np.where(values > 0, values * factor, values), dtype=np.float64)


def stage_figures(model: ReplayModel) -> StageFigures | None:
    """Slowdown, ``m_s``, ``m_w`` and the worst stage on the stage-balanced ideal; ``None``
    when the job has no pipeline stages."""
    balanced = stage_balanced(model)
    gap_free = balanced if splits_compute(model) else stage_balanced(model, gap_free=True)
    if balanced is None or gap_free is None:
        return None
    w = WhatIf(balanced)
    stage = model.lane_stage
    lanes = tuple(tuple(int(x) for x in np.flatnonzero(stage == s)) for s in range(int(stage.max()) + 1))
    add = w.run([Scenario(True, *w.selection(list(ln), with_transfer=False)) for ln in lanes])
    cost = add.mean(axis=1) / max(float(w.t_ideal.mean()), 1e-12) - 1.0
    worst = int(np.argmax(cost))
    rem, _ = w.removal([w.selection(list(lanes[-1]), True), w.selection(list(lanes[worst]), True)])
    return StageFigures(
        slowdown=w.slowdown,
        m_s=float(rem[0]),
        m_w=_worker_removal(WhatIf(gap_free), lanes),
        stage=worst,
        recovered=float(rem[1]),
        stage_lanes=lanes,
        stage_cost=tuple(float(c) for c in cost),
    )


def _worker_removal(w: WhatIf, stage_lanes: tuple[tuple[int, ...], ...]) -> float | None:
    """``m_w`` (module docstring)."""
    k = max(1, int(np.ceil(w.model.n_lanes * WORKER_SHARE)))
    cand, cost = candidates(w, max_candidates=max(8, 2 * k))
    if not cand:
        return None
    own: F64 = cost.mean(axis=1)
    cut = float(own[min(k, own.size) - 1])
    if cut > 0:
        tied = {c for c, o in zip(cand, own, strict=True) if o >= TIE * cut}
        if not any(set(ln) <= tied for ln in stage_lanes):
            k = max(k, len(tied))
    rem, _ = w.removal([w.selection(list(cand[:k]), with_transfer=False)])
    return float(rem[0])


class StageImbalance(msgspec.Struct, frozen=True):
    """``stragglers.whatif.stage``: the stage what-if of a pipeline job (module docstring).

    ``stage``: the stage with the highest own cost; ``ranks``: its ranks; ``cost``: its own
    slowdown ``S - 1``; ``recovered``: the share of the stage-balanced slowdown balancing it
    recovers; ``slowdown``, ``m_s``, ``m_w``: against the stage-balanced ideal; ``explains``:
    the stage, not a worker, explains the slowdown (``recovered`` >= ``EXPLAINS``, ``m_w`` <
    ``NOT_A_WORKER``, ``slowdown`` >= 1 + ``MIN_SLOWDOWN``); ``stage_ranks``: every stage's
    ranks, stage 0 first."""

    stage: int
    ranks: list[int]
    cost: float
    recovered: float
    slowdown: float
    m_s: float
    m_w: float | None
    explains: bool
    stage_ranks: list[list[int]]


def stage_imbalance(model: ReplayModel) -> StageImbalance | None:
    """``StageImbalance`` of a model whose lanes are named by their ranks; ``None`` without
    pipeline stages."""
    fig = stage_figures(model)
    if fig is None:
        return None
    ranks = [[int(model.lane_name[ln]) for ln in lanes] for lanes in fig.stage_lanes]
    explains = (
        fig.recovered >= EXPLAINS
        and (fig.m_w is None or fig.m_w < NOT_A_WORKER)
        and fig.slowdown >= 1.0 + MIN_SLOWDOWN
    )
    return StageImbalance(
        stage=fig.stage,
        ranks=ranks[fig.stage],
        cost=fig.stage_cost[fig.stage],
        recovered=fig.recovered,
        slowdown=fig.slowdown,
        m_s=fig.m_s,
        m_w=fig.m_w,
        explains=bool(explains),
        stage_ranks=ranks,
    )


REPLICA_EXPLAINS = 0.5  # a replica explains the slowdown when fixing it recovers half of it ...
REPLICA_MIN_SLOWDOWN = 0.02  # ... of a slowdown of 2 % or more


class SlowReplica(msgspec.Struct, frozen=True):
    """``stragglers.whatif.replica``: the pipeline replica whose ranks, made like the other
    replicas of their stages (the replica-typical ideal), recover the most of the slowdown.

    ``ranks``: its ranks; ``recovered``: the share of the slowdown fixing it recovers;
    ``cost``: its own slowdown ``S - 1`` (the ideal job with only it observed); ``late_steps``:
    the steps in which that own cost is at least half its largest and 2 % or more (the verdict
    re-decides them like a rank's, ``stragglers.replay_report._late``);
    ``explains``: it recovers ``REPLICA_EXPLAINS`` of a slowdown of ``REPLICA_MIN_SLOWDOWN`` or
    more, and twice what any other replica recovers; ``step_cost``: that own cost in each step
    (``S_w - 1`` per step, against the step's ideal time). A replica slowed as a whole (every stage of
    one pipeline) costs little rank by rank, since fixing one of its ranks leaves the others
    slow: the straggler search, rank by rank, does not find it."""

    ranks: list[int]
    recovered: float
    cost: float
    late_steps: list[int]
    explains: bool
    step_cost: list[float] = []


def slow_replica(w: WhatIf) -> SlowReplica | None:
    """``SlowReplica`` of a replay whose lanes are named by ranks; ``None`` without two
    pipeline replicas."""
    rep = w.model.lane_replica
    if rep is None:
        return None
    ids = sorted({int(x) for x in rep if x >= 0})
    if len(ids) < 2:
        return None
    groups = [[int(x) for x in np.flatnonzero(rep == r)] for r in ids]
    rem, _ = w.removal([w.selection(g, with_transfer=False) for g in groups])
    best = int(np.argmax(rem))
    own = w.run([Scenario(True, *w.selection(groups[best], with_transfer=False))])[0]
    cost = own / np.maximum(w.t_ideal, 1e-12) - 1.0
    bar = max(0.02, 0.5 * float(cost.max(initial=0.0)))
    others = np.delete(rem, best)
    explains = (
        float(rem[best]) >= REPLICA_EXPLAINS
        and w.slowdown >= 1.0 + REPLICA_MIN_SLOWDOWN
        and bool((others < 0.5 * rem[best]).all())
    )
    return SlowReplica(
        ranks=sorted(int(w.model.lane_name[ln]) for ln in groups[best]),
        recovered=float(rem[best]),
        cost=float(cost.mean()),
        late_steps=[int(k) for k in np.flatnonzero(cost >= bar)],
        explains=bool(explains),
        step_cost=[float(x) for x in cost],
    )


prime_structs(globals())
