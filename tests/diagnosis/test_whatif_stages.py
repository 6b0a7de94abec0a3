"""The stage-balanced ideal of a pipeline whose work is split into compute and host gap
(``whatif.stages._typed``) and the split itself (``whatif.kineto.window_compute``), on a small
hand-built job whose figures are worked out by hand in the docstrings."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from kinetoscope.diagnosis.whatif.build import Items, JobInfo, Visits, assemble
from kinetoscope.diagnosis.whatif.kineto import window_compute
from kinetoscope.diagnosis.whatif.model import ReplayModel
from kinetoscope.diagnosis.whatif.stages import splits_compute, stage_balanced

# Two stages x two replicas, one step, two micro-batches. Lanes 0, 1: stage 0 (send, send,
# end); lanes 2, 3: stage 1 (recv, recv, end). Per visit: (lane, sync, arrival, finish, work,
# compute); lane 0 spends 10 of the 30 before its second send in a host gap.
_VISITS = [
    (0, 0, 10, 11, 10, 10),
    (0, 1, 41, 42, 30, 20),
    (0, 4, 42, 42, 0, 0),
    (1, 2, 30, 31, 30, 30),
    (1, 3, 41, 42, 10, 10),
    (1, 5, 42, 42, 0, 0),
    (2, 0, 0, 11, 0, 0),
    (2, 1, 51, 51, 40, 40),
    (2, 6, 91, 91, 40, 40),
    (3, 2, 0, 31, 0, 0),
    (3, 3, 51, 51, 20, 20),
    (3, 7, 111, 111, 60, 60),
]


def _pipeline(with_compute: bool = True) -> ReplayModel:
    v = np.asarray(_VISITS, dtype=np.float64)
    lane = v[:, 0].astype(np.int64)
    chain = np.tile(np.arange(3), 4).astype(np.int64)
    visits = Visits(lane, np.zeros(12, dtype=np.int64), chain, v[:, 1].astype(np.int64), v[:, 2], v[:, 3])
    items = Items(
        np.arange(12), np.zeros(12, dtype=np.int64), v[:, 4], v[:, 4], v[:, 5] if with_compute else None
    )
    is_end = np.r_[np.zeros(4, dtype=bool), np.ones(4, dtype=bool)]
    info = JobInfo(
        n_lanes=4,
        n_steps=1,
        independent_steps=False,
        labels=("between", "tail"),
        sync_label=is_end.astype(np.int64),
        sync_is_end=is_end,
        lane_name=("0", "1", "2", "3"),
        lane_stage=np.asarray([0, 0, 1, 1], dtype=np.int64),
        observed_step_time=np.asarray([111.0]),
        lane_busy=np.asarray([[30.0], [40.0], [80.0], [80.0]]),
        lane_replica=np.asarray([0, 1, 0, 1], dtype=np.int64),
    )
    return assemble(visits, items, info)


def _per_lane(model: ReplayModel, values: np.ndarray, lane: int) -> list[float]:
    """A lane's item values in its time order (items are sorted by sync order)."""
    return [float(x) for x in values[model.item_lane == lane]]


def test_typed_ideal_takes_each_visit_at_its_types_mean_share_of_the_mean_stage() -> None:
    """Stage 0's compute per step: median of 30 and 40 = 35; stage 1's: 80; the mean stage's:
    57.5. Stage 0's shares of its step's compute per position: lane 0 1/3, 2/3; lane 1 3/4,
    1/4; their means 13/24 and 11/24, so both replicas' ideal is 57.5 x 13/24 and 57.5 x 11/24,
    whatever order their micro-batches came in. Stage 1: shares 1/2, 1/2 and 1/4, 3/4, means
    3/8 and 5/8. The observed side keeps compute only (lane 0's host gap of 10 is gone)."""
    model = _pipeline()
    assert splits_compute(model)
    bal = stage_balanced(model)
    assert bal is not None
    for lane in (0, 1):
        assert _per_lane(bal, bal.item_ideal, lane) == pytest.approx([57.5 * 13 / 24, 57.5 * 11 / 24, 0.0])
    for lane in (2, 3):
        assert _per_lane(bal, bal.item_ideal, lane) == pytest.approx([0.0, 57.5 * 3 / 8, 57.5 * 5 / 8])
    assert _per_lane(bal, bal.item_work, 0) == pytest.approx([10.0, 20.0, 0.0])
    assert _per_lane(bal, bal.item_work, 3) == pytest.approx([0.0, 20.0, 60.0])


def test_without_the_split_each_lanes_ideal_is_its_own_work_scaled() -> None:
    """Without compute intervals the lane's own sequence is kept and scaled to 57.5: lane 0's
    observed 10 and 30 (host gap included) become 57.5 x 1/4 and 57.5 x 3/4."""
    model = _pipeline(with_compute=False)
    assert not splits_compute(model)
    bal = stage_balanced(model)
    assert bal is not None
    assert _per_lane(bal, bal.item_ideal, 0) == pytest.approx([57.5 / 4, 57.5 * 3 / 4, 0.0])


def test_window_compute_counts_the_compute_inside_each_window_of_its_own_lane() -> None:
    """Lane 0 computes over [0, 10) and [20, 30); lane 1 over [5, 15). Windows: lane 0 [5, 25]
    holds 5 + 5; lane 0 [10, 20] none; lane 1 [0, 100] all 10; lane 1 [12, 13] 1."""
    spans = pl.DataFrame({"lane": [0, 0, 1], "start": [0.0, 20.0, 5.0], "end": [10.0, 30.0, 15.0]})
    lane = np.asarray([0, 0, 1, 1])
    lo = np.asarray([5.0, 10.0, 0.0, 12.0])
    hi = np.asarray([25.0, 20.0, 100.0, 13.0])
    assert window_compute(lane, lo, hi, spans).tolist() == pytest.approx([10.0, 0.0, 10.0, 1.0])
