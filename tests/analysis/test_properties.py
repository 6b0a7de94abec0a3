"""Property tests on synthetic traces whose answers are known by construction (brute force over
a ns grid, or closed-form for hand-built cases)."""

from __future__ import annotations

import random

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synth import US, comm, kernel, launch, launched, make_trace, memcpy

from kinetoscope.analysis.comm_overlap import comm_comp_overlap
from kinetoscope.analysis.counters import (
    memory_bw_time_series,
    queue_length_time_series,
    time_blocked_on_full_queue,
)
from kinetoscope.analysis.idle_time import idle_time_breakdown, idle_time_interval_stats
from kinetoscope.analysis.kernel_breakdown import kernel_breakdown, kernel_type_breakdown
from kinetoscope.analysis.launch_stats import kernel_launch_stats, kernel_launch_summary
from kinetoscope.analysis.temporal import temporal_breakdown
from kinetoscope.analysis.user_annotation import gpu_kernels_with_user_annotations

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KINDS = ("comp", "comm", "mem")
NAMES = {
    "comp": "void gemm_kernel<float>(float*)",
    "comm": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)",
    "mem": "Memcpy DtoD (Device -> Device)",
}
CATS = {"comp": "kernel", "comm": "kernel", "mem": "gpu_memcpy"}

interval = st.tuples(
    st.sampled_from(KINDS), st.integers(0, 400), st.integers(0, 60), st.integers(1, 3)
)  # kind, ts, dur, stream


def _build(items, shuffle_seed=None):
    evs = [
        kernel(ts, dur, name=NAMES[k], cat=CATS[k], stream=s, correlation=i + 1)
        for i, (k, ts, dur, s) in enumerate(items)
    ]
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(evs)
    return make_trace(evs)


def _mask(items, kinds=KINDS, size=500):
    m = np.zeros(size, dtype=bool)
    for k, ts, dur, _s in items:
        if k in kinds:
            m[ts : ts + dur] = True
    return m


@SETTINGS
@given(st.lists(interval, min_size=1, max_size=25), st.integers(0, 10**6))
def test_temporal_matches_brute_force(items, seed):
    t = _build(items, shuffle_seed=seed)
    row = temporal_breakdown(t).row(0, named=True)
    busy = _mask(items).sum()
    comp = _mask(items, ("comp",)).sum()
    span = max(ts + d for _, ts, d, _ in items) - min(ts for _, ts, _, _ in items)
    assert row["kernel_time(us)"] * 1000 == pytest.approx(span)
    assert row["idle_time(us)"] * 1000 == pytest.approx(span - busy)
    assert row["compute_time(us)"] * 1000 == pytest.approx(comp)
    assert row["non_compute_time(us)"] * 1000 == pytest.approx(busy - comp)
    if span:
        total = row["idle_time_pctg"] + row["compute_time_pctg"] + row["non_compute_time_pctg"]
        assert total == pytest.approx(100, abs=0.02)


@SETTINGS
@given(st.lists(interval, min_size=1, max_size=25))
def test_kernel_type_breakdown_partitions_busy_time(items):
    t = _build(items)
    kt = kernel_type_breakdown(t)
    masks = {k: _mask(items, (k,)) for k in KINDS}
    expected: dict[str, int] = {}
    names = {"comp": "COMPUTATION", "comm": "COMMUNICATION", "mem": "MEMORY"}
    for cell in range(500):
        on = [names[k] for k in KINDS if masks[k][cell]]
        if on:
            label = " overlapping ".join(on)
            expected[label] = expected.get(label, 0) + 1
    got = {r["kernel_type"]: round(r["sum"] * 1000) for r in kt.iter_rows(named=True)}
    assert got == expected
    if expected:
        assert kt["percentage"].sum() == pytest.approx(100, abs=0.1 * len(expected))


@SETTINGS
@given(st.lists(interval, min_size=1, max_size=25))
def test_comm_overlap_matches_brute_force(items):
    t = _build(items)
    row = comm_comp_overlap(t).row(0, named=True)
    comm_m, comp_m = _mask(items, ("comm",)), _mask(items, ("comp",))
    both = (comm_m & comp_m).sum()
    assert row["communication_time(us)"] * 1000 == pytest.approx(comm_m.sum())
    assert row["overlap_time(us)"] * 1000 == pytest.approx(both)
    if comm_m.sum() == 0:
        assert row["comp_comm_overlap_pctg"] is None
    else:
        assert row["comp_comm_overlap_pctg"] == pytest.approx(round(100 * both / comm_m.sum(), 2))


def test_two_kernels_overlapping_by_x_on_two_streams():
    x = 7 * US
    t = make_trace([comm(0, 20 * US, stream=1), kernel(20 * US - x, 30 * US, stream=2)])
    tb = temporal_breakdown(t).row(0, named=True)
    assert tb["kernel_time(us)"] == pytest.approx(20 - 7 + 30)
    assert tb["idle_time(us)"] == 0
    ov = comm_comp_overlap(t).row(0, named=True)
    assert ov["overlap_time(us)"] == pytest.approx(7)
    assert ov["comp_comm_overlap_pctg"] == pytest.approx(35.0)
    kt = {r["kernel_type"]: r["sum"] for r in kernel_type_breakdown(t).iter_rows(named=True)}
    assert kt == {"COMMUNICATION": 13.0, "COMPUTATION": 23.0, "COMPUTATION overlapping COMMUNICATION": 7.0}


@SETTINGS
@given(
    st.lists(st.tuples(st.integers(0, 80), st.integers(0, 40), st.integers(0, 60)), min_size=1, max_size=20),
    st.integers(0, 10**6),
)
def test_idle_categories_sum_to_stream_idle_time(gaps, seed):
    """One stream; each kernel's launch happens ``lead`` µs before/after the previous end.
    The categories must add up to span - busy of the stream, whatever the overlaps."""
    evs = []
    t_end = 0
    spans = []
    for gap, dur, lead in gaps:
        k_ts = t_end + gap * US - 20 * US  # may overlap the previous kernel
        k_ts = max(k_ts, 0)
        evs += launched(k_ts - lead * US, 1 * US, k_ts, dur * US)
        spans.append((k_ts, k_ts + dur * US))
        t_end = max(t_end, k_ts + dur * US)
    random.Random(seed).shuffle(evs)
    t = make_trace(evs)
    out = idle_time_breakdown(t)
    span = max(e for _, e in spans) - min(s for s, _ in spans)
    m = np.zeros(span + 1, dtype=bool)
    base = min(s for s, _ in spans)
    for s, e in spans:
        m[s - base : e - base] = True
    assert out["idle_time"].sum() * 1000 == pytest.approx(span - m.sum())
    assert set(out["idle_category"]) == {"host_wait", "kernel_wait", "other"}
    assert (out["idle_time"] >= 0).all()


def test_idle_host_wait_kernel_wait_other_by_construction():
    y = 50 * US
    evs = []
    evs += launched(0, 2 * US, 3 * US, 10 * US)  # k1 [3, 13)
    evs += launched(13 * US + y, 2 * US, 13 * US + y + 2 * US, 5 * US)  # launched Y after k1 ended: host wait
    # k2 ends at 13+50+2+5 = 70; k3 launched early, starts 10 µs after k2: kernel wait
    evs += launched(20 * US, 2 * US, 80 * US, 5 * US)
    # k4 launched early, starts 100 µs after k3 ended (85): other
    evs += launched(21 * US, 2 * US, 185 * US, 5 * US)
    t = make_trace(evs)
    got = {r["idle_category"]: r["idle_time"] for r in idle_time_breakdown(t).iter_rows(named=True)}
    assert got == {"host_wait": 52.0, "kernel_wait": 10.0, "other": 100.0}
    # the threshold is in µs
    got5 = {
        r["idle_category"]: r["idle_time"]
        for r in idle_time_breakdown(t, consecutive_kernel_delay_us=5).iter_rows(named=True)
    }
    assert got5 == {"host_wait": 52.0, "kernel_wait": 0.0, "other": 110.0}
    stats = idle_time_interval_stats(t)
    assert dict(zip(stats["idle_category"], stats["count"])) == {"host_wait": 1, "kernel_wait": 1, "other": 1}


def test_overlap_on_one_stream_is_not_idle_time():
    """HTA would add the -4 µs gap of the overlapping kernel to kernel_wait."""
    t = make_trace(
        [
            kernel(0, 10 * US, correlation=1),
            kernel(6 * US, 10 * US, correlation=2),
            kernel(20 * US, 1 * US, correlation=3),
        ]
    )
    got = {r["idle_category"]: r["idle_time"] for r in idle_time_breakdown(t).iter_rows(named=True)}
    assert got == {"host_wait": 0.0, "kernel_wait": 4.0, "other": 0.0}


def test_empty_and_cpu_only_traces_give_empty_frames():
    cpu = make_trace([{"cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 0, "dur": 5}])
    empty = make_trace([])
    for t in (cpu, empty):
        for fn in (
            temporal_breakdown,
            idle_time_breakdown,
            kernel_type_breakdown,
            kernel_breakdown,
            comm_comp_overlap,
            kernel_launch_stats,
            kernel_launch_summary,
            queue_length_time_series,
            memory_bw_time_series,
        ):
            out = fn(t)
            assert out.is_empty(), fn.__name__
            assert "rank" in out.columns


def test_zero_duration_kernels():
    t = make_trace(
        [kernel(0, 0, correlation=1), kernel(5 * US, 0, correlation=2), kernel(2 * US, 1 * US, correlation=3)]
    )
    tb = temporal_breakdown(t).row(0, named=True)
    assert tb["kernel_time(us)"] == 5.0 and tb["idle_time(us)"] == 4.0 and tb["compute_time(us)"] == 1.0
    kb = kernel_breakdown(t).row(0, named=True)
    assert kb["count"] == 3 and kb["min (us)"] == 0.0 and kb["sum (us)"] == 1.0
    only_zero = make_trace([kernel(3 * US, 0, correlation=1)])
    assert temporal_breakdown(only_zero).row(0, named=True)["kernel_time(us)"] == 0.0
    assert temporal_breakdown(only_zero).row(0, named=True)["idle_time_pctg"] is None


@SETTINGS
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(1, 20)), min_size=12, max_size=40))
def test_kernel_breakdown_stats_are_per_call_even_when_folded(calls):
    """More names than num_kernels: every row's stats are over the calls it covers."""
    evs = []
    t0 = 0
    for i, (name_i, dur) in enumerate(calls):
        evs.append(kernel(t0, dur * US, name=f"k{name_i}", correlation=i + 1))
        t0 += 100 * US
    t = make_trace(evs)
    kb = kernel_breakdown(t, num_kernels=3)
    raw = pl.DataFrame({"name": [f"k{n}" for n, _ in calls], "d": [float(d) for _, d in calls]})
    assert kb["count"].sum() == len(calls)
    assert kb["sum (us)"].sum() == pytest.approx(raw["d"].sum())
    shown = kb.filter(pl.col("name") != "others")
    assert shown.height <= 3
    for r in shown.iter_rows(named=True):
        d = raw.filter(pl.col("name") == r["name"])["d"]
        assert (r["count"], r["max (us)"], r["min (us)"]) == (d.len(), d.max(), d.min())
        assert r["mean (us)"] == pytest.approx(d.mean())
    others = kb.filter(pl.col("name") == "others")
    if others.height:
        rest = raw.filter(~pl.col("name").is_in(shown["name"].implode()))["d"]
        o = others.row(0, named=True)
        assert (o["count"], o["max (us)"], o["min (us)"]) == (rest.len(), rest.max(), rest.min())


@SETTINGS
@given(
    st.lists(
        st.tuples(st.integers(0, 100), st.integers(0, 30), st.integers(-20, 60), st.integers(0, 20)),
        min_size=1,
        max_size=20,
    )
)
def test_launch_delay_and_queue_length(items):
    """launch at ts with dur; kernel starts ``offset`` after the launch start (negative = clock skew)."""
    evs = []
    for ts, ldur, offset, kdur in items:
        evs += launched(ts * US, ldur * US, (ts + offset) * US, kdur * US)
    t = make_trace(evs)
    ls = kernel_launch_stats(t)
    assert ls.height == len(items)
    exp = sorted(max(0, off - ldur) for _ts, ldur, off, _k in items)
    assert sorted(ls["launch_delay"].to_list()) == pytest.approx(exp)
    q = queue_length_time_series(t)
    assert q.height == 2 * len(items)
    assert q["queue_length"].min() >= 0
    assert q["queue_length"].to_list()[-1] == 0
    assert q["queue_length"].max() <= len(items)


def test_queue_full_lists_every_stream():
    evs = []
    for s in (1, 2):  # both streams get 3 outstanding launches for a while
        for i in range(3):
            evs += launched(i * US, 1, 100 * US + i * US * s, 1 * US, stream=s)
    t = make_trace(evs)
    out = time_blocked_on_full_queue(t, max_queue_length=3)
    assert out["stream"].to_list() == [1, 2]
    # stream 1: queue is 3 from t=2 until its first kernel starts at 100 -> 98 µs; stream 2 the same
    assert out["duration_at_max_queue_length"].to_list() == [98.0, 98.0]


def test_memory_bandwidth_back_to_back_and_zero_length():
    t = make_trace(
        [
            memcpy(0, 10 * US, bw=5.0, correlation=1),
            memcpy(10 * US, 10 * US, bw=7.0, correlation=2),
            memcpy(30 * US, 0, bw=2.0, correlation=3),
        ]
    )
    ts = memory_bw_time_series(t)
    vals = ts["memory_bw_gbps"].to_list()
    assert min(vals) >= 0 and max(vals) == 7.0  # never 5 + 7 at the shared instant
    assert 2.0 in vals  # the zero-length copy counts (as 1 µs)


@SETTINGS
@given(
    st.lists(st.tuples(st.integers(0, 100), st.integers(0, 100)), min_size=1, max_size=8),
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 20)), min_size=1, max_size=15),
)
def test_leaf_annotation_is_shortest_overlapping(anns, kers):
    evs = []
    for i, (ts, dur) in enumerate(anns):
        evs.append(
            {
                "cat": "gpu_user_annotation",
                "name": f"a{i}",
                "pid": 0,
                "tid": 7,
                "ts": ts * US,
                "dur": dur * US,
            }
        )
    for j, (ts, dur) in enumerate(kers):
        evs.append(kernel(ts * US, dur * US, correlation=j + 1))
    t = make_trace(evs)
    out = gpu_kernels_with_user_annotations(t)
    for r in out.iter_rows(named=True):
        kts, kend = r["ts(us)"], r["ts(us)"] + r["dur(us)"]
        cands = [(d, -ts, -i) for i, (ts, d) in enumerate(anns) if ts < kend and kts < ts + d]
        if not cands:
            assert r["user_annotation"] is None
        else:
            best = min(cands)
            assert r["user_annotation"] == f"a{-best[2]}"


def test_zero_length_kernel_inside_annotation_is_annotated():
    t = make_trace(
        [
            {"cat": "gpu_user_annotation", "name": "fwd", "pid": 0, "tid": 7, "ts": 0, "dur": 10 * US},
            kernel(5 * US, 0, correlation=1),
        ]
    )
    assert gpu_kernels_with_user_annotations(t)["user_annotation"].to_list() == ["fwd"]


def test_launch_names_beyond_hta():
    evs = launched(0, 2 * US, 5 * US, 1 * US, launch_name="cuLaunchKernel")
    evs += launched(10 * US, 2 * US, 15 * US, 1 * US, launch_name="hipLaunchKernel")
    evs += [launch(20 * US, 1 * US, 999, name="cudaGraphLaunch"), kernel(25 * US, 1 * US, correlation=999)]
    t = make_trace(evs)
    assert kernel_launch_stats(t)["launch_name"].to_list() == ["cuLaunchKernel", "hipLaunchKernel"]
