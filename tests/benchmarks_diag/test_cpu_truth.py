"""The CPU jobs' arrival-order ground truth (benchmarks/diag_scenarios/truth.py) that checks the
accuracy benchmark's labels: hand-built gloo-like rank files with known arrivals, so every figure
below is computed by hand, not by the product."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.diag_scenarios import truth

STEP_US = 50_000.0


def _rank_file(tmp_path: Path, rank: int, delays_us: list[float]) -> Path:
    """Two all-reduces per 50 ms step, issued at 20 ms and 40 ms into the step plus this rank's
    delay; one optimizer step at the end of each step; a trailing op of another name."""
    events = []
    for k, d in enumerate(delays_us):
        t0 = k * STEP_US
        for off in (20_000.0, 40_000.0):
            events.append(
                {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "ts": t0 + off + d, "dur": 100}
            )
        events.append(
            {"ph": "X", "cat": "cpu_op", "name": "Optimizer.step#SGD.step", "ts": t0 + 45_000.0, "dur": 500}
        )
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::add_", "ts": 1.0, "dur": 5})
    p = tmp_path / f"rank-{rank}_{1000 + rank}.pt.trace.json"
    p.write_text(json.dumps({"traceEvents": events}))
    return p


def test_a_late_rank_imposes_its_margin_over_the_next_latest(tmp_path: Path) -> None:
    steps = 4
    files = [
        _rank_file(tmp_path, 0, [0.0] * steps),
        _rank_file(tmp_path, 1, [1_000.0] * steps),  # 1 ms behind rank 0 at every instance
        _rank_file(tmp_path, 2, [0.0, 6_000.0, 0.0, 0.0]),  # 6 ms late in step 1 only
    ]
    gt, step, n_steps = truth.cpu_ground_truth(files)
    assert (gt.n_instances, step, n_steps) == (8, STEP_US, steps)
    # rank 2 is last at step 1's two instances by 6 - 1 = 5 ms: one delay, issued twice
    # (asynchronous collectives), imposes 5 ms in its step; rank 1 is last by 1 ms at the
    # other three steps' instances
    assert gt.imposed_us == pytest.approx({0: 0.0, 1: 3 * 1_000.0, 2: 5_000.0})
    assert gt.last_count == {0: 0, 1: 6, 2: 2}
    # per step: rank 2 imposes 5 ms / 4 steps / 50 ms = 2.5 %, rank 1 3 ms / 4 / 50 = 1.5 %
    assert truth.host_made(gt, step, n_steps, labelled=[], floor=0.02) == {2: 0.025}
    assert truth.host_made(gt, step, n_steps, labelled=[2], floor=0.02) == {}
    assert truth.host_made(gt, step, n_steps, labelled=[], floor=0.01) == {1: 0.015, 2: 0.025}
    assert truth.host_made(gt, step, n_steps, labelled=[]) == {}  # the 5 % default floor


def test_instances_missing_on_a_rank_are_left_out(tmp_path: Path) -> None:
    files = [_rank_file(tmp_path, 0, [0.0] * 3), _rank_file(tmp_path, 1, [2_000.0] * 2)]
    gt, _step, _n = truth.cpu_ground_truth(files)
    assert gt.n_instances == 4 and gt.imposed_us == pytest.approx({0: 0.0, 1: 2 * 2_000.0})


@pytest.mark.parametrize(("late_us", "share", "ok"), [(1_000.0, 0.02, False), (6_000.0, 0.12, True)])
def test_a_label_whose_ranks_cost_under_the_floor_is_weak(tmp_path: Path, late_us, share, ok) -> None:
    # rank 2 is labelled (injected) and late by late_us at both instances of every 50 ms step:
    # 1 ms is 2 % of a step per step, under the 5 % naming floor (the host absorbed the delay),
    # 6 ms is 12 %
    from benchmarks.bench_diagnosis import check_cpu_truth
    from benchmarks.diag_scenarios.score import Outcome

    steps = 4
    files = [_rank_file(tmp_path, r, [late_us if r == 2 else 0.0] * steps) for r in range(3)]
    o = Outcome("job", "cpu", "small", "persistent", [2], "none", [])
    check_cpu_truth(o, files)
    assert o.params["label_share"] == pytest.approx(share) and o.params["host_made"] == {}
    assert o.truth_ok is ok
    # a label that holds every rank leaves nobody outside it to wait: the waits its ranks impose
    # on each other count (here rank 2's on the other two)
    everyone = Outcome("job", "cpu", "intermittent", "intermittent", [0, 1, 2], "none", [])
    check_cpu_truth(everyone, files)
    assert everyone.params["label_share"] == pytest.approx(share) and everyone.truth_ok is ok


def test_every_rank_delayed_alike_makes_nobody_wait(tmp_path: Path) -> None:
    # both ranks of two sleep 6 ms before each collective (12 % of a step): nobody waits for
    # anybody, so a label of both as stragglers is one the truth contradicts
    from benchmarks.bench_diagnosis import check_cpu_truth
    from benchmarks.diag_scenarios.score import Outcome

    files = [_rank_file(tmp_path, r, [6_000.0] * 4) for r in range(2)]
    both = Outcome("job", "cpu", "persistent2", "persistent", [0, 1], "none", [])
    check_cpu_truth(both, files)
    assert both.params["label_share"] == 0.0 and both.truth_ok is False


def test_steady_skew_counts_the_steps_a_rank_arrives_after_the_others(tmp_path: Path) -> None:
    # rank 2 is 1 ms late at both instances of every step (2 % of a 50 ms step), but in step 0
    # rank 1 is 3 ms late, so rank 2 is after the others' median (1.5 ms) in 3 of 4 steps; rank 1
    # is after it in 1 of 4, its median skew that of its punctual steps (-0.5 ms: the others'
    # median includes rank 2's 1 ms)
    files = [
        _rank_file(tmp_path, 0, [0.0] * 4),
        _rank_file(tmp_path, 1, [3_000.0, 0.0, 0.0, 0.0]),
        _rank_file(tmp_path, 2, [1_000.0] * 4),
    ]
    skew = truth.steady_skew(files)
    assert skew[2] == (3, 4, 0.02)
    assert skew[1] == (1, 4, -0.01)
    assert skew[0][0] == 0
