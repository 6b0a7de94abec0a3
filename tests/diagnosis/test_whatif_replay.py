"""The what-if replay engine (kinetoscope.diagnosis.whatif) on small jobs with known answers.

Jobs are built by hand or from a seeded generator (``_job``): lanes run tensor-parallel-style
groups and a job-wide sync; the expected step times are computed here independently, by a plain
per-sync loop over the same durations.
"""

from __future__ import annotations

import numpy as np
import pytest

from kinetoscope.diagnosis.whatif.build import Items, JobInfo, Visits, assemble
from kinetoscope.diagnosis.whatif.model import typical
from kinetoscope.diagnosis.whatif.replay import build_schedule, observed_replay
from kinetoscope.diagnosis.whatif.search import WhatIf, _best_option, explain
from tests.diagnosis.job_logs import one_step_info


def _job(n_lanes: int, n_steps: int, slow: dict[int, float], seed: int = 3, group: int = 4):
    """Visits/items of a job: per step, 6 group syncs then one job-wide sync; ``slow`` scales a
    lane's work. Observed times come from an independent plain loop (the reference)."""
    rng = np.random.default_rng(seed)
    lanes, steps, chain, syncs, arr, fin, work = [], [], [], [], [], [], []
    t = np.zeros(n_lanes)
    key = 0
    for s in range(n_steps):
        for j in range(7):
            members = (
                [list(range(n_lanes))]
                if j == 6
                else [list(range(g, min(g + group, n_lanes))) for g in range(0, n_lanes, group)]
            )
            for mem in members:
                w = rng.uniform(0.9, 1.1, len(mem)) * np.array([slow.get(m, 1.0) for m in mem])
                a = t[mem] + w
                end = a.max() + 0.05
                for m, wi, ai in zip(mem, w, a, strict=True):
                    lanes.append(m), steps.append(s), chain.append(s * 8 + j), syncs.append(key)
                    arr.append(ai), fin.append(end), work.append(wi)
                t[mem] = end
                key += 1
        for m in range(n_lanes):  # step end
            lanes.append(m), steps.append(s), chain.append(s * 8 + 7), syncs.append(key)
            arr.append(t[m]), fin.append(t[m]), work.append(0.0)
            key += 1
    v = Visits(*(np.asarray(x) for x in (lanes, steps, chain, syncs)), np.asarray(arr), np.asarray(fin))
    sync_is_end = np.zeros(key, dtype=bool)
    sync_is_end[np.asarray(syncs)[np.asarray(work) == 0.0]] = True
    sync_label = sync_is_end.astype(np.int64)
    group_of = np.where(sync_is_end[v.sync], key + v.step, v.sync)
    w = np.asarray(work)
    items = Items(np.arange(w.size), np.zeros(w.size, dtype=np.int64), w, typical(w, group_of))
    ends = np.asarray(fin)[sync_is_end[v.sync]].reshape(n_steps, n_lanes).max(axis=1)
    info = JobInfo(
        n_lanes=n_lanes,
        n_steps=n_steps,
        independent_steps=False,
        labels=("compute", "step-end"),
        sync_label=sync_label,
        sync_is_end=sync_is_end,
        lane_name=tuple(f"rank{r}" for r in range(n_lanes)),
        lane_stage=np.zeros(n_lanes, dtype=np.int64),
        observed_step_time=np.diff(ends, prepend=0.0),
    )
    return assemble(v, items, info)


def test_hand_built_two_lanes_replay_and_ideal():
    # lane 0 works 1 then 3; lane 1 works 2 then 1; syncs transfer 0.5 each
    v = Visits(
        lane=np.array([0, 1, 0, 1, 0, 1]),
        step=np.zeros(6, dtype=np.int64),
        chain=np.array([0, 0, 1, 1, 2, 2]),
        sync=np.array([0, 0, 1, 1, 2, 3]),
        arrival=np.array([1.0, 2.0, 5.5, 3.5, 6.0, 6.0]),
        finish=np.array([2.5, 2.5, 6.0, 6.0, 6.0, 6.0]),
    )
    items = Items(
        np.arange(4),
        np.zeros(4, dtype=np.int64),
        np.array([1.0, 2.0, 3.0, 1.0]),
        np.array([1.5, 1.5, 2.0, 2.0]),
    )
    m = assemble(v, items, one_step_info(6.0))
    assert m.inc_transfer[:4].tolist() == [0.5, 0.5, 0.5, 0.5]
    assert observed_replay(m, build_schedule(m)).tolist() == [6.0]
    w = WhatIf(m)
    assert w.t_ideal.tolist() == [1.5 + 0.5 + 2.0 + 0.5]
    rem, add = w.removal([w.selection([0], with_transfer=False)])
    # lane 0 ideal: sync0 at max(1.5, 2) + .5 = 2.5; sync1 at max(4.5, 3.5) + .5 = 5 -> recovers 1 of 1.5
    assert rem[0] == pytest.approx(1.0 / 1.5)


@pytest.mark.parametrize("slow", [{}, {5: 1.4}, {2: 1.3, 9: 1.25}])
def test_replay_reproduces_the_reference_timeline(slow):
    m = _job(12, 4, slow)
    got = observed_replay(m, build_schedule(m))
    np.testing.assert_allclose(got, m.observed_step_time, rtol=1e-12)


def test_clean_job_has_no_material_slowdown_and_names_nobody():
    w = WhatIf(_job(12, 4, {}))
    assert w.slowdown < 1.08
    assert explain(w, min_gain=0.05).lanes == ()


def test_one_straggler_is_named_alone_and_recovers_most():
    w = WhatIf(_job(16, 5, {6: 1.5}))
    exp = explain(w, min_gain=0.05)
    assert exp.lanes == (6,)
    assert exp.recovered_fraction > 0.8


def test_masked_co_straggler_is_found():
    # lane 3 masks lane 10 (both in the job-wide sync); removing 3 alone leaves 10's cost
    w = WhatIf(_job(16, 5, {3: 1.5, 10: 1.45}))
    exp = explain(w, min_gain=0.05)
    assert set(exp.lanes) == {3, 10}
    rem, _ = w.removal([w.selection([3], False), w.selection([3, 10], False)])
    assert rem[1] > rem[0] + 0.2


def test_ranks_slowed_together_share_their_ties_saving():
    # four lanes slowed alike, one in each group: one tie, each carrying a quarter of its saving
    w = WhatIf(_job(16, 5, {2: 1.3, 6: 1.3, 10: 1.3, 14: 1.3}))
    exp = explain(w, min_gain=0.05)
    assert set(exp.lanes) == {2, 6, 10, 14}
    assert exp.gains[0] == pytest.approx(exp.option_gains[0] / 4)
    assert exp.option_gains == (exp.option_gains[0],) * 4 and sum(exp.gains) == pytest.approx(
        exp.option_gains[0]
    )


@pytest.mark.parametrize(
    ("options", "saved", "best"),
    [
        # a stalling lane saves 6 %; with a noisy lane tied to it 7.5 %: the noise does not ride along
        ([[1], [4], [1, 4]], [0.06, 0.01, 0.075], 0),
        # two lanes masking each other: each alone saves nothing, together 20 %
        ([[3], [10], [3, 10]], [0.0, 0.0, 0.2], 2),
        # a slow node: one of its lanes alone saves 5 %, the four together 16 % (11 % more >= 3 x 2 %)
        ([[4], [5], [4, 5, 6, 7]], [0.05, 0.0, 0.16], 2),
        # no lane alone saves the bar: the tie is judged whole (3 %)
        ([[4], [5], [4, 5]], [0.015, 0.01, 0.03], 2),
    ],
)
def test_a_tie_counts_only_when_its_extra_lanes_each_save_the_bar(options, saved, best):
    assert _best_option(options, np.asarray(saved), 0.02) == best


def test_per_label_and_topological_repair_of_noisy_order():
    m = _job(8, 3, {1: 1.3})
    w = WhatIf(m)
    assert set(w.per_label()) == {"compute"}
    assert w.per_label()["compute"] == pytest.approx(w.slowdown)
