"""Discrete-event replay of a :class:`ReplayModel`, vectorised over scenarios and over syncs.

A sync starts when its last member arrives (``max`` over members of: the member's previous
finish + its local work) and finishes ``transfer`` later on every member. Syncs are processed
in *batches*: runs of consecutive syncs (in topological order) none of which depends on another
of the same run, so one batch is a handful of NumPy calls whatever its size. Every call carries
a leading *scenario* axis: one replay evaluates many what-ifs at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kinetoscope.diagnosis.whatif.model import F64, I64, ReplayModel


@dataclass(frozen=True)
class Schedule:
    """Batches of independent syncs and the index arrays a replay needs (built once per model)."""

    batch_inc: tuple[tuple[int, int], ...]  # incidence range [a, b) of each batch
    batch_sync: tuple[tuple[int, int], ...]  # sync range [a, b) of each batch
    sync_first_inc: I64  # first incidence of each sync
    sync_count: I64  # members of each sync
    end_inc: I64  # incidences of step-end syncs, sorted by step
    end_step_start: I64  # offsets of each step's block in ``end_inc``
    batch_width: tuple[int, ...]  # members of every sync of the batch when equal, else 0


def build_schedule(model: ReplayModel) -> Schedule:
    """Group syncs into batches of mutually independent syncs (one pass over the syncs)."""
    n_sync = model.n_syncs
    counts = np.bincount(model.inc_sync, minlength=n_sync).astype(np.int64)
    first = np.r_[0, np.cumsum(counts)[:-1]].astype(np.int64)
    prev_sync = np.where(model.inc_prev >= 0, model.inc_sync[np.maximum(model.inc_prev, 0)], -1)
    max_pred = np.full(n_sync, -1, dtype=np.int64)
    np.maximum.at(max_pred, model.inc_sync, prev_sync)
    cuts = _batch_cuts(max_pred.tolist())
    bounds = list(zip(cuts, [*cuts[1:], n_sync], strict=True))
    inc_bounds = np.r_[first, model.inc_sync.shape[0]]
    batch_inc = tuple((int(inc_bounds[a]), int(inc_bounds[b])) for a, b in bounds)
    is_end = model.sync_is_end[model.inc_sync]
    end_inc = np.flatnonzero(is_end)
    end_inc = end_inc[np.argsort(model.inc_step[end_inc], kind="stable")]
    end_steps = model.inc_step[end_inc]
    end_step_start = np.searchsorted(end_steps, np.arange(model.n_steps)).astype(np.int64)
    width = []
    for a, b in bounds:
        c = counts[a:b]
        width.append(int(c[0]) if c.size and bool((c == c[0]).all()) else 0)
    return Schedule(
        batch_width=tuple(width),
        batch_inc=batch_inc,
        batch_sync=tuple(bounds),
        sync_first_inc=first,
        sync_count=counts,
        end_inc=end_inc.astype(np.int64),
        end_step_start=end_step_start,
    )


def _batch_cuts(max_pred: list[int]) -> list[int]:
    """Start of each batch: a sync opens a new batch when it depends on one in the current."""
    cuts = [0]
    start = 0
    for k, pred in enumerate(max_pred):
        if pred >= start and k > start:
            start = k
            cuts.append(k)
    return cuts


def incidence_work(model: ReplayModel, item_work: F64) -> F64:
    """Sum item durations (items x scenarios) into incidence work (incidences x scenarios)."""
    if item_work.shape[0] == model.inc_lane.shape[0]:  # one item per incidence
        return item_work
    return np.asarray(np.add.reduceat(item_work, model.item_start, axis=0), dtype=np.float64)


def replay(model: ReplayModel, schedule: Schedule, work: F64, transfer: F64) -> F64:
    """Replay every scenario: returns the step times (scenarios x steps).

    ``work`` and ``transfer``: per incidence (incidences x scenarios): the local work before the
    visit, and how long after the sync's last arrival the member leaves. Incidence-major, so gathers of previous finishes and per-sync maxima move rows.
    """
    if model.inc_async.any():
        return _replay_async(model, schedule, work, transfer)
    n_inc, n_scen = work.shape
    finish = np.zeros((n_inc + 1, n_scen))  # last row: the origin (0) of first visits
    prev = np.where(model.inc_prev >= 0, model.inc_prev, n_inc)
    first, counts = schedule.sync_first_inc, schedule.sync_count
    batches = zip(schedule.batch_inc, schedule.batch_sync, schedule.batch_width, strict=True)
    for (a, b), (ka, kb), width in batches:
        arrive = finish[prev[a:b]]
        arrive += work[a:b]
        if width == 1:  # every sync of the batch has a single member
            arrive += transfer[a:b]
            finish[a:b] = arrive
            continue
        if width:
            start = _fold_max(arrive.reshape(kb - ka, width, n_scen))
            finish[a:b].reshape(kb - ka, width, n_scen)[:] = start[:, None, :]
        else:
            start = np.maximum.reduceat(arrive, first[ka:kb] - a, axis=0)
            finish[a:b] = np.repeat(start, counts[ka:kb], axis=0)
        finish[a:b] += transfer[a:b]
    return _step_times(model, schedule, finish[:n_inc].T)


def _replay_async(model: ReplayModel, schedule: Schedule, work: F64, transfer: F64) -> F64:
    """``replay`` with asynchronous visits: each lane keeps its own clock (issue time) beside
    the finish of its last sync. An asynchronous visit is ready at ``max(clock + work, previous
    finish)`` (issued, and the communication thread free); a blocking one first waits for the
    previous sync, then works: ``max(clock, previous finish) + work``. After a blocking or a
    waited-for visit the clock is its finish."""
    n_inc, n_scen = work.shape
    finish = np.zeros((n_inc + 1, n_scen))
    clock = np.zeros((n_inc + 1, n_scen))
    prev = np.where(model.inc_prev >= 0, model.inc_prev, n_inc)
    is_async = model.inc_async[:, None]
    keeps_clock = is_async if model.inc_waited is None else (model.inc_async & ~model.inc_waited)[:, None]
    first, counts = schedule.sync_first_inc, schedule.sync_count
    for (a, b), (ka, kb) in zip(schedule.batch_inc, schedule.batch_sync, strict=True):
        p = prev[a:b]
        asy = is_async[a:b]
        f_prev = finish[p]
        own = np.where(asy, clock[p], np.maximum(clock[p], f_prev)) + work[a:b]
        ready = np.where(asy, np.maximum(own, f_prev), own)
        start = np.maximum.reduceat(ready, first[ka:kb] - a, axis=0)
        fin = np.repeat(start, counts[ka:kb], axis=0) + transfer[a:b]
        finish[a:b] = fin
        clock[a:b] = np.where(keeps_clock[a:b], own, fin)
    return _step_times(model, schedule, finish[:n_inc].T)


def _fold_max(x: F64) -> F64:
    """Max over the middle axis by halving (faster than ``max(axis=1)`` on short, wide rows)."""
    while x.shape[1] > 1:
        half = x.shape[1] // 2
        y = np.maximum(x[:, :half], x[:, half : 2 * half])
        if x.shape[1] % 2:
            np.maximum(y[:, 0], x[:, -1], out=y[:, 0])
        x = y
    return np.asarray(x[:, 0], dtype=np.float64)


def _step_times(model: ReplayModel, schedule: Schedule, finish: F64) -> F64:
    """Step time = latest lane end of the step minus the previous step's (or the origin)."""
    ends = finish[:, schedule.end_inc]
    step_end = np.maximum.reduceat(ends, schedule.end_step_start, axis=1)
    if model.independent_steps:
        return np.asarray(step_end, dtype=np.float64)
    return np.asarray(np.diff(step_end, axis=1, prepend=0.0), dtype=np.float64)


def observed_replay(model: ReplayModel, schedule: Schedule) -> F64:
    """Step times of the replay with every observed duration (one scenario)."""
    work = incidence_work(model, model.item_work[:, None])
    out = replay(model, schedule, work, model.inc_transfer[:, None])
    return np.asarray(out[0], dtype=np.float64)
