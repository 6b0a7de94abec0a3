"""The replay model of a traced job: lanes, synchronisation points and the local work between them.

Terms (used across ``whatif/``):

*lane*
    One sequential timeline: a rank (Kineto jobs) or a worker (one data-parallel x pipeline
    position; tensor-parallel peers act as one). A lane alternates local work and
    synchronisation points.
*synchronisation point* (sync)
    A collective instance of one process group, a pipeline send/recv pair, or a lane's end of a
    step (a sync with one member). It starts when its last member arrives; each member leaves it
    its own ``transfer`` later (observed: its end minus the last arrival).
*incidence*
    One lane's visit of one sync: the lane arrives after its local work (``work`` of the
    incidence, summed from its *items*) and leaves when the sync finishes.
*item*
    One piece of local work with an operation-type label (forward, backward, optimizer,
    dataloader, host gap, ...) and an *ideal* duration: what the typical peer takes for it.
*asynchronous visit*
    A collective a lane issues without waiting for it (gloo buckets): the lane's own clock goes
    on from the arrival, while its next collective cannot start before this one finished (one
    communication thread). A blocking visit (GPU stream order, step end) moves the clock to the
    finish.
*waited-for visit*
    An asynchronous visit after which the lane waited for the sync to finish (a synchronous
    ``dist.all_reduce`` on gloo: issued to the communication thread, then waited for): it is
    issued like an asynchronous visit, and the lane's clock then moves to its finish.
*step origin*
    With ``independent_steps`` every lane restarts each step at time 0 (the artifact's traces
    hold unrelated steps); otherwise a lane carries on from where its previous step ended.

The arrays are plain NumPy so a replay is a few vectorised operations per batch of independent
syncs (:mod:`kinetoscope.diagnosis.whatif.replay`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class ReplayModel:
    """A job as lanes visiting synchronisation points in order (see the module docstring).

    Incidences are sorted by (sync order, lane); ``sync_order`` is topological: every lane visits
    its syncs in increasing order. Items are sorted by incidence; every incidence has >= 1 item.
    """

    n_lanes: int
    n_steps: int
    independent_steps: bool
    inc_lane: I64
    inc_sync: I64
    inc_step: I64
    inc_prev: I64  # index of the same lane's previous incidence, -1 at a step origin
    inc_async: B  # the lane issues the collective and goes on (gloo): its clock is the arrival
    inc_transfer: F64  # how long after the sync's last arrival this member leaves it
    inc_ideal_transfer: F64  # the typical transfer of the sync's kind
    sync_label: I64  # index into ``labels`` (collective type / send-recv / step end)
    sync_is_end: B  # a lane's end of step (one member)
    item_inc: I64
    item_work: F64
    item_ideal: F64
    item_label: I64  # index into ``labels``
    labels: tuple[str, ...]
    lane_name: tuple[str, ...]
    lane_stage: I64  # pipeline stage of each lane (0 when the job has none)
    observed_step_time: F64  # what the trace says each step took (same units as work)
    lane_replica: I64 | None = None  # pipeline jobs: the lanes' pipeline (lanes joined by transfers)
    lane_busy: F64 | None = None  # pipeline jobs: lanes x steps, each lane's compute per step; else None
    # pipeline jobs whose compute intervals are known: the compute within each item's work (the
    # rest is host gap: launch delays, data loading, waits no event records); else None
    item_compute: F64 | None = None
    inc_waited: B | None = None  # waited-for visits (asynchronous ones the lane then waited for); None: none

    @property
    def n_syncs(self) -> int:
        """Number of synchronisation points, step ends included."""
        return int(self.sync_label.shape[0])

    @cached_property
    def item_lane(self) -> I64:
        """Lane of each item."""
        return self.inc_lane[self.item_inc]

    @cached_property
    def item_unattributed(self) -> B:
        """Items no what-if may change (a builder sets their ideal to what was observed): the
        tails of the last step of a job whose lanes carry on from step to step. No
        synchronisation of the trace follows them, so whether a long one would have delayed
        anyone is not observed."""
        if self.independent_steps:
            return np.zeros(self.item_inc.shape[0], dtype=bool)
        inc = self.item_inc
        last = self.inc_step[inc] == self.n_steps - 1
        return np.asarray(self.sync_is_end[self.inc_sync[inc]] & last, dtype=np.bool_)

    @cached_property
    def item_start(self) -> I64:
        """Index of each incidence's first item (items are sorted by incidence)."""
        return np.searchsorted(self.item_inc, np.arange(self.inc_lane.shape[0])).astype(np.int64)


def typical(values: F64, groups: I64, how: str = "median") -> F64:
    """Per element, the median (``lower``: the lower median, of two the smaller; or ``mean``)
    of its group: what the typical peer takes.

    Vectorised over any number of groups (one sort); ``groups`` are non-negative codes.
    """
    if values.size == 0:
        return np.asarray(values.copy(), dtype=np.float64)
    if how == "mean":
        sums = np.bincount(groups, weights=values)
        counts = np.bincount(groups)
        return np.asarray((sums / np.maximum(counts, 1))[groups], dtype=np.float64)
    order = np.lexsort((values, groups))
    g_sorted = groups[order]
    v_sorted = values[order]
    starts = np.flatnonzero(np.r_[True, g_sorted[1:] != g_sorted[:-1]])
    counts = np.diff(np.r_[starts, g_sorted.size])
    lo = v_sorted[starts + (counts - 1) // 2]
    hi = lo if how == "lower" else v_sorted[starts + counts // 2]
    med = np.empty(int(groups.max()) + 1)
    med[g_sorted[starts]] = (lo + hi) / 2.0
    return np.asarray(med[groups], dtype=np.float64)


def previous_incidence(inc_lane: I64, inc_step: I64, independent_steps: bool) -> I64:
    """Index of each incidence's predecessor on its lane (incidences in topological order)."""
    n = inc_lane.shape[0]
    order = np.lexsort((np.arange(n), inc_lane))  # stable by position within each lane
    prev = np.full(n, -1, dtype=np.int64)
    same_lane = inc_lane[order[1:]] == inc_lane[order[:-1]]
    if independent_steps:
        same_lane &= inc_step[order[1:]] == inc_step[order[:-1]]
    prev[order[1:][same_lane]] = order[:-1][same_lane]
    return prev
