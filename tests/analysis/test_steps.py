"""Step detection (ProfilerStep#N, else optimizer steps) and assignment of events to steps."""

from __future__ import annotations

import polars as pl
import pytest
from synth import US, kernel, launched, make_trace, op

from kinetoscope.analysis.steps import assign_steps, detect_steps, step_durations
from kinetoscope.analysis.temporal import temporal_breakdown, temporal_breakdown_by_step


def test_profiler_steps_all_kept_including_last():
    evs = [
        op(0, 100 * US, "ProfilerStep#5", cat="user_annotation"),
        op(100 * US, 50 * US, "ProfilerStep#6", cat="user_annotation"),
        op(150 * US, 70 * US, "ProfilerStep#7", cat="user_annotation"),
        op(10 * US, 5 * US, "aten::mm"),
    ]
    steps = detect_steps(make_trace(evs, rank=2))
    assert steps.to_dicts() == [
        {"rank": 2, "step": 5, "start": 0, "end": 100 * US, "source": "ProfilerStep"},
        {"rank": 2, "step": 6, "start": 100 * US, "end": 150 * US, "source": "ProfilerStep"},
        {"rank": 2, "step": 7, "start": 150 * US, "end": 220 * US, "source": "ProfilerStep"},
    ]
    sd = step_durations(make_trace(evs, rank=2))
    assert sd["duration(us)"].to_list() == [100.0, 50.0, 70.0]


def test_optimizer_steps_when_no_profiler_step():
    evs = [
        op(5 * US, 1 * US, "aten::empty"),  # trace start = 5
        op(40 * US, 10 * US, "Optimizer.step#SGD.step", cat="user_annotation"),
        op(95 * US, 5 * US, "Optimizer.step#SGD.step", cat="user_annotation"),
        op(150 * US, 10 * US, "Optimizer.step#SGD.step", cat="user_annotation"),
        op(170 * US, 10 * US, "aten::mm"),
    ]  # after the last optimizer step: incomplete, not a step
    steps = detect_steps(make_trace(evs))
    assert steps.select("step", "start", "end", "source").rows() == [
        (0, 5 * US, 50 * US, "optimizer"),
        (1, 50 * US, 100 * US, "optimizer"),
        (2, 100 * US, 160 * US, "optimizer"),
    ]


def test_two_optimizers_per_iteration_use_one():
    evs = []
    for i in range(3):
        base = i * 100 * US
        evs.append(op(base + 50 * US, 5 * US, "Optimizer.step#SparseAdam.step", cat="user_annotation"))
        evs.append(op(base + 60 * US, 5 * US, "Optimizer.step#AdamW.step", cat="user_annotation"))
    steps = detect_steps(make_trace(evs))
    assert steps["end"].to_list() == [65 * US, 165 * US, 265 * US]  # AdamW ends last


def test_no_steps():
    assert detect_steps(make_trace([kernel(0, 5)])).is_empty()
    assert temporal_breakdown_by_step(make_trace([kernel(0, 5)])).is_empty()


def test_device_events_belong_to_the_step_that_launched_them():
    evs = [
        op(0, 100 * US, "ProfilerStep#1", cat="user_annotation"),
        op(100 * US, 100 * US, "ProfilerStep#2", cat="user_annotation"),
    ]
    evs += launched(90 * US, 5 * US, 120 * US, 10 * US)  # launched in step 1, runs in step 2
    evs += launched(110 * US, 5 * US, 135 * US, 10 * US)
    evs.append(kernel(50 * US, 1 * US, correlation=None))  # no launch: placed by its own ts
    t = make_trace(evs)
    dev = t.device_events().sort("ts")
    assigned = assign_steps(t, dev)
    assert assigned.select("ts", "step").rows() == [(50 * US, 1), (120 * US, 1), (135 * US, 2)]
    assert assign_steps(t, dev, by_launch=False)["step"].to_list() == [1, 2, 2]
    # same row order as the input
    assert assign_steps(t)["idx"].to_list() == t.events["idx"].to_list()
    by_step = temporal_breakdown_by_step(t)
    assert by_step["step"].to_list() == [1, 2]
    assert by_step["kernel_time(us)"].to_list() == [80.0, 10.0]


def test_real_trace_keeps_last_profiler_step(hta_traces):
    from hta_parity_support import ours

    t = ours("trace_diff/control/control.json.gz")
    steps = detect_steps(t)
    assert steps["step"].to_list() == [1009, 1010, 1011, 1012, 1013, 1014]
    assert set(steps["source"]) == {"ProfilerStep"}
    by_step = temporal_breakdown_by_step(t)
    assert by_step["step"].to_list() == steps["step"].to_list()
    # every kernel of this trace is launched inside a step, so the per-step compute adds up
    whole = temporal_breakdown(t).row(0, named=True)
    assert by_step["compute_time(us)"].sum() == pytest.approx(whole["compute_time(us)"], rel=0.01)


def test_real_on_demand_trace_uses_optimizer_steps(hta_traces):
    from hta_parity_support import ours

    t = ours("with_gpu_user_annotation/step_based_trace_2543932.json.gz")
    steps = detect_steps(t)
    assert steps.height == 5 and set(steps["source"]) == {"optimizer"}
    assert steps["step"].to_list() == [0, 1, 2, 3, 4]
    assert (steps["end"] > steps["start"]).all()
    # contiguous: each step starts where the previous ended
    assert steps["start"].to_list()[1:] == steps["end"].to_list()[:-1]
    assert not temporal_breakdown_by_step(t).is_empty()
    assert pl.Series(temporal_breakdown_by_step(t)["step"]).is_sorted()
