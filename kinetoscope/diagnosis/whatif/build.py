"""Assemble a :class:`ReplayModel` from per-lane visits of syncs and the work items before them.

Importers (the OSDI '25 artifact, Kineto collective instances) describe a job as *visits*: lane
``l`` reaches sync ``k`` (its ``chain`` position-th stop) at ``arrival`` and leaves at ``finish``
(observed), and *items*: pieces of local work done before a visit. This module orders the syncs
topologically, derives each sync's transfer time and lays the arrays out for the replay.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kinetoscope.diagnosis.whatif.model import (
    F64,
    I64,
    B,
    ReplayModel,
    previous_incidence,
    typical,
)

_MAX_REPAIR_ROUNDS = 10_000


@dataclass(frozen=True)
class Visits:
    """One row per lane visit of a sync (any order). Sync keys are dense ``0..K-1``."""

    lane: I64
    step: I64
    chain: I64  # position of the visit in its lane's chain (increasing in time)
    sync: I64
    arrival: F64  # when the lane could start the sync (for asynchronous visits: also after its previous one)
    finish: F64
    is_async: B | None = None
    waited: B | None = None  # asynchronous visits the lane then waited for (``ReplayModel.inc_waited``)


@dataclass(frozen=True)
class Items:
    """Local work: ``visit`` is the index of the visit the item precedes."""

    visit: I64
    label: I64
    work: F64
    ideal: F64
    compute: F64 | None = None  # the part of ``work`` that is compute (``ReplayModel.item_compute``)


@dataclass(frozen=True)
class JobInfo:
    """What the model needs besides visits and items."""

    n_lanes: int
    n_steps: int
    independent_steps: bool
    labels: tuple[str, ...]
    sync_label: I64  # per sync key
    sync_is_end: B  # per sync key
    lane_name: tuple[str, ...]
    lane_stage: I64
    observed_step_time: F64
    ideal_transfer_by_sync: bool = False  # typical transfer: of the sync's members in the same role
    # (blocking or asynchronous: a gloo send ends at its enqueue, its receive when the data came), else of its kind
    clip_transfer: bool = True  # a member leaving before the last arrival (clock noise) -> 0
    lane_replica: I64 | None = None  # pipeline replica of each lane (``ReplayModel``)
    lane_busy: F64 | None = None  # lanes x steps: time outside blocking syncs (``ReplayModel``)


def sync_transfer(visits: Visits, n_syncs: int, clip: bool = True) -> tuple[F64, F64]:
    """Per sync: observed start (last arrival); per visit: its transfer (end after it; >= 0
    with ``clip``, else exact, so the replay reproduces every end)."""
    start = np.full(n_syncs, -np.inf)
    np.maximum.at(start, visits.sync, visits.arrival)
    after = visits.finish - start[visits.sync]
    return start, np.maximum(after, 0.0) if clip else after


def topological_rank(visits: Visits, start: F64, n_syncs: int) -> I64:
    """Sync order: by observed start, repaired where a lane's chain disagrees (clock noise)."""
    key = start.copy()
    order = np.lexsort((visits.chain, visits.step, visits.lane))
    lane_sorted = visits.lane[order]
    same = lane_sorted[1:] == lane_sorted[:-1]
    before = visits.sync[order[:-1]][same]
    after = visits.sync[order[1:]][same]
    for _ in range(_MAX_REPAIR_ROUNDS):
        bad = key[after] <= key[before]
        if not bad.any():
            break
        np.maximum.at(key, after[bad], np.nextafter(key[before[bad]], np.inf))
    else:
        raise ValueError("replay model: the lanes' orders of synchronisation points form a cycle")
    rank = np.empty(n_syncs, dtype=np.int64)
    rank[np.lexsort((np.arange(n_syncs), key))] = np.arange(n_syncs)
    return rank


def assemble(visits: Visits, items: Items, info: JobInfo) -> ReplayModel:
    """Build the model: topological sync ids, incidences sorted by sync, items by incidence."""
    n_syncs = int(info.sync_label.shape[0])
    start, transfer = sync_transfer(visits, n_syncs, info.clip_transfer)
    sync_step = np.zeros(n_syncs, dtype=np.int64)
    sync_step[visits.sync] = visits.step
    span = float(np.ptp(visits.finish)) + float(np.ptp(visits.arrival)) + 1.0
    rank = topological_rank(visits, start + sync_step * span, n_syncs)
    new_sync = rank[visits.sync]
    inc_order = np.lexsort((visits.lane, new_sync))
    inv = np.empty_like(inc_order)
    inv[inc_order] = np.arange(inc_order.shape[0])
    inc_lane = visits.lane[inc_order]
    inc_sync = new_sync[inc_order]
    inc_step = visits.step[inc_order]
    n_inc = inc_order.shape[0]
    inc_async = visits.is_async[inc_order] if visits.is_async is not None else np.zeros(n_inc, dtype=bool)
    inc_waited = visits.waited[inc_order] & inc_async if visits.waited is not None else None
    item_inc, label, work, ideal, compute = _items_per_incidence(items, inv, inc_order.shape[0])
    by_rank = np.empty(n_syncs, dtype=np.int64)
    by_rank[rank] = np.arange(n_syncs)
    s_label = info.sync_label[by_rank]
    inc_transfer = transfer[inc_order]
    return ReplayModel(
        n_lanes=info.n_lanes,
        n_steps=info.n_steps,
        independent_steps=info.independent_steps,
        inc_lane=inc_lane,
        inc_sync=inc_sync,
        inc_step=inc_step,
        inc_prev=previous_incidence(inc_lane, inc_step, info.independent_steps),
        inc_async=inc_async,
        inc_waited=inc_waited if inc_waited is not None and inc_waited.any() else None,
        inc_transfer=inc_transfer,
        inc_ideal_transfer=typical(
            inc_transfer, inc_sync * 2 + inc_async if info.ideal_transfer_by_sync else s_label[inc_sync]
        ),
        sync_label=s_label,
        sync_is_end=info.sync_is_end[by_rank],
        item_inc=item_inc,
        item_work=work,
        item_ideal=ideal,
        item_label=label,
        labels=info.labels,
        lane_name=info.lane_name,
        lane_stage=info.lane_stage,
        observed_step_time=info.observed_step_time,
        lane_busy=info.lane_busy,
        lane_replica=info.lane_replica,
        item_compute=compute,
    )


def _items_per_incidence(items: Items, inv: I64, n_inc: int) -> tuple[I64, I64, F64, F64, F64 | None]:
    """Items re-indexed by incidence and sorted; a zero item for incidences without work."""
    inc = inv[items.visit]
    missing = np.setdiff1d(np.arange(n_inc), inc)
    inc = np.r_[inc, missing]
    zeros = np.zeros(missing.shape[0])
    label = np.r_[items.label, np.zeros(missing.shape[0], dtype=np.int64)]
    work = np.r_[items.work, zeros]
    ideal = np.r_[items.ideal, zeros]
    compute = None if items.compute is None else np.r_[items.compute, zeros]
    order = np.argsort(inc, kind="stable")
    return inc[order], label[order], work[order], ideal[order], None if compute is None else compute[order]
