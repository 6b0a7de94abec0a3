"""Parity with HTA (traceinsight 0.6.1) on every trace of the corpus that has device events.

HTA runs on a copy of each trace with ``include_last_profiler_step=True``; our analyses run on
``hta_view`` of our tables (HTA's µs rounding of ns traces, and its dropping of device events
without a host correlation when a trace has >= 2 ProfilerSteps). See hta_parity_support.py for
why. Tolerances, per analysis:

* temporal breakdown, kernel-type breakdown, comm/comp overlap, launch stats, GPU user
  annotations: exact (1e-6 µs), except that on mtia_inference HTA's own rounding creates 207
  events of duration -1 µs that its interval merge counts as negative busy time: there the
  temporal numbers agree within 207 µs;
* kernel breakdown: same rows and sums exactly; per-kernel max/min/mean/stddev exactly where
  HTA does not fold kernels into "others" (where it does, HTA's statistics are those of the
  per-kernel sums, a documented HTA bug, and ours are checked against the raw calls);
* idle time: exact on every stream without overlapping events; on streams where events
  overlap (a deliberate difference), within the sum of the per-event gap differences;
* queue length: same streams and counts; the mean within (points sharing a timestamp) /
  count, std within max(1 %, twice that), quantiles/max within 1 (HTA sorts simultaneous
  +1/-1 in arbitrary order; we apply +1 first);
* memory bandwidth: exact unless HTA's series has float residue points (tiny positive values
  after + and - of the same numbers, which HTA counts) or simultaneous copy end/start (HTA's
  order can add both); then ours has no more points and no higher peak than HTA's.
"""

from __future__ import annotations

import math

import polars as pl
import pytest
from hta_parity_support import cleanup, gpu_traces, hta, hta_rank, hta_view_of, ours, pd_to_pl

from kinetoscope.analysis.comm_overlap import comm_comp_overlap
from kinetoscope.analysis.counters import memory_bw_summary, queue_length_summary, queue_length_time_series
from kinetoscope.analysis.idle_time import idle_time_breakdown
from kinetoscope.analysis.kernel_breakdown import kernel_breakdown, kernel_type_breakdown
from kinetoscope.analysis.kernel_types import HTA_LAUNCH_STATS_KERNEL_NAMES, HTA_LAUNCH_STATS_MEMORY_NAMES
from kinetoscope.analysis.launch_stats import kernel_launch_stats
from kinetoscope.analysis.temporal import temporal_breakdown
from kinetoscope.analysis.user_annotation import (
    gpu_kernels_with_user_annotations,
    gpu_user_annotation_breakdown,
)

pytestmark = [pytest.mark.hta, pytest.mark.filterwarnings("ignore")]

TRACES = gpu_traces()
WITH_DEVICE = [r for r in TRACES if r != "large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz"]
EPS = 1e-6


@pytest.fixture(scope="module", autouse=True)
def _cleanup_hta_copies():
    yield
    cleanup()


def _negative_durations(rel: str) -> int:
    d = hta_view_of(rel, stream_rows_as_device=True).device_events()
    return d.filter(pl.col("dur") < 0).height


def _describe(df_pd) -> pl.DataFrame:
    df_pd = df_pd.copy()
    df_pd.columns = [c[1] if isinstance(c, tuple) else c for c in df_pd.columns]
    return pd_to_pl(df_pd.reset_index())


def test_corpus_coverage():
    assert len(TRACES) >= 20
    assert (
        "trace_diff/control/control.json.gz" in TRACES
        and "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz" in TRACES
    )


def test_trace_without_device_events_hta_crashes_we_return_empty():
    rel = "large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz"
    assert ours(rel).device_events().is_empty()
    with pytest.raises(IndexError):
        hta(rel).get_temporal_breakdown(visualize=False)
    assert temporal_breakdown(ours(rel)).is_empty()


@pytest.mark.parametrize("rel", WITH_DEVICE)
def test_temporal_breakdown(rel):
    h = hta(rel).get_temporal_breakdown(visualize=False).iloc[0].to_dict()
    o = temporal_breakdown(hta_view_of(rel, stream_rows_as_device=True)).row(0, named=True)
    tol = _negative_durations(rel) + EPS
    for col in ("idle_time(us)", "compute_time(us)", "non_compute_time(us)", "kernel_time(us)"):
        assert abs(o[col] - h[col]) <= tol, col
    for col in ("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"):
        assert abs(o[col] - h[col]) <= 0.01 + 100 * tol / h["kernel_time(us)"], col


@pytest.mark.parametrize("rel", WITH_DEVICE)
def test_comm_comp_overlap(rel):
    h = hta(rel).get_comm_comp_overlap(visualize=False).iloc[0]["comp_comm_overlap_pctg"]
    o = comm_comp_overlap(hta_view_of(rel, stream_rows_as_device=True)).row(0, named=True)[
        "comp_comm_overlap_pctg"
    ]
    if math.isnan(h):  # HTA: 0/0 with a numpy warning; ours: null
        assert o is None
    else:
        assert o == pytest.approx(h, abs=EPS)


@pytest.mark.parametrize("rel", WITH_DEVICE)
def test_kernel_type_and_kernel_breakdown(rel):
    h_types, h_kernels = hta(rel).get_gpu_kernel_breakdown(visualize=False)
    v = hta_view_of(rel, stream_rows_as_device=True)
    tol = _negative_durations(rel) + EPS
    h_t = {
        r["kernel_type"]: (r["sum"], r["percentage"])
        for r in pd_to_pl(h_types).iter_rows(named=True)
        if r["sum"] > 0
    }
    o_t = {
        r["kernel_type"]: (r["sum"], r["percentage"]) for r in kernel_type_breakdown(v).iter_rows(named=True)
    }
    # labels that only HTA's negative-duration artefacts produce are at most ``tol`` long
    assert {k for k, v in o_t.items() if v[0] > tol} == {k for k, v in h_t.items() if v[0] > tol}
    for k in o_t.keys() & h_t.keys():
        assert abs(o_t[k][0] - h_t[k][0]) <= tol, k
        assert abs(o_t[k][1] - h_t[k][1]) <= 0.1 + EPS, k

    hk = pd_to_pl(h_kernels)
    ok = kernel_breakdown(v)
    key = ["kernel_type", "name"]
    m = ok.join(hk, on=key, how="full", coalesce=True, suffix="_h")
    assert m.filter(pl.col("count").is_null() | pl.col("sum (us)_h").is_null()).is_empty(), "different rows"
    assert ((m["sum (us)"] - m["sum (us)_h"]).abs() <= EPS).all()
    raw = v.device_events()
    for kt, g in m.group_by("kernel_type"):
        kt = kt[0]
        folded = (g["name"] == "others").any()
        for r in g.iter_rows(named=True):
            if not folded:  # HTA's statistics are per call here: must match exactly
                for c in ("max (us)", "min (us)", "mean (us)", "stddev"):
                    assert r[c] == pytest.approx(r[c + "_h"], abs=1e-6), (r["name"], c)
            elif r["name"] != "others":
                # HTA bug: in the folding branch a listed kernel's max/min/mean collapse to its sum
                assert r["max (us)_h"] == r["min (us)_h"] == r["mean (us)_h"] == r["sum (us)_h"]
                d = raw.filter(pl.col("name") == r["name"])["dur"] / 1000.0
                assert (r["count"], r["max (us)"], r["min (us)"]) == (d.len(), d.max(), d.min())


def _gap_difference_bound(v, stream: int) -> float:
    """Sum over a stream's events of |our gap - HTA's gap| (µs)."""
    d = (
        v.device_events()
        .filter(pl.col("stream") == stream)
        .with_columns(end=pl.col("ts") + pl.col("dur"))
        .sort("ts", "end", "idx")
        .with_columns(prev=pl.col("end").shift(1), front=pl.col("end").cum_max().shift(1))
        .drop_nulls("prev")
    )
    ours_gap = (d["ts"] - d["front"]).clip(lower_bound=0)
    hta_gap = d["ts"] - d["prev"]
    return float((ours_gap - hta_gap).abs().sum()) / 1000.0


def _has_overlap(v, stream: int) -> bool:
    return _gap_difference_bound(v, stream) > 0


@pytest.mark.parametrize("rel", WITH_DEVICE)
def test_idle_time_breakdown(rel):
    r = hta_rank(ours(rel))
    h, _ = hta(rel).get_idle_time_breakdown(ranks=[r], visualize=False)
    hp = pd_to_pl(h).select(
        pl.col("stream").cast(pl.Int64),
        "idle_category",
        pl.col("idle_time").alias("h"),
        pl.col("idle_time_ratio").alias("hr"),
    )
    v = hta_view_of(rel)
    o = idle_time_breakdown(v)
    m = o.join(hp, on=["stream", "idle_category"], how="left").with_columns(pl.col("h").fill_null(0.0))
    assert set(hp["stream"]) == set(o["stream"])
    for stream, g in m.group_by("stream"):
        stream = stream[0]
        diff = (g["idle_time"] - g["h"]).abs().sum()
        if _has_overlap(v, stream):
            assert diff <= 2 * _gap_difference_bound(v, stream) + EPS
        else:
            assert diff <= EPS, stream
            # HTA rounds the ratio to 2 decimals
            ok = g.filter(pl.col("hr").is_not_null() & pl.col("idle_time_ratio").is_not_null())
            assert ((ok["idle_time_ratio"] - ok["hr"]).abs() <= 0.005 + EPS).all()


@pytest.mark.parametrize("rel", WITH_DEVICE)
def test_kernel_launch_stats(rel):
    r = hta_rank(ours(rel))
    h = pd_to_pl(hta(rel).get_cuda_kernel_launch_stats(ranks=[r], visualize=False)[r])
    o = kernel_launch_stats(hta_view_of(rel)).filter(
        pl.col("launch_name").is_in(HTA_LAUNCH_STATS_KERNEL_NAMES + HTA_LAUNCH_STATS_MEMORY_NAMES)
    )
    assert o.height == h.height
    if h.is_empty():
        return
    h = h.with_columns(pl.col("correlation").cast(pl.Int64))
    m = o.join(h, on="correlation", how="inner", suffix="_h")
    assert m.height == o.height
    for c in ("cpu_duration", "gpu_duration", "launch_delay"):
        assert ((m[c] - m[c + "_h"].cast(pl.Float64)).abs() <= EPS).all(), c


@pytest.mark.parametrize("rel", WITH_DEVICE)
def test_queue_length_summary(rel):
    r = hta_rank(ours(rel))
    h = _describe(hta(rel).get_queue_length_summary(ranks=[r])).with_columns(pl.col("stream").cast(pl.Int64))
    v = hta_view_of(rel)
    o = queue_length_summary(v)
    assert set(o["stream"]) == set(h["stream"])
    m = o.join(h, on="stream", suffix="_h")
    # HTA's index_correlation is 0 for a partner at traceEvents[0], and "> 0" drops that pair
    first_is_device = (
        v.device_events().filter((pl.col("idx") == 0) & pl.col("correlation").is_not_null()).height
    )
    assert (m["count"] - m["count_h"]).sum() == 2 * first_is_device
    if first_is_device:
        return
    # Points that share their time with another point on the stream: only there can the order
    # of +1/-1 differ, each by at most 1.
    ts = queue_length_time_series(v)
    ties = dict(
        ts.group_by("stream", "ts")
        .agg(pl.len().alias("n"))
        .filter(pl.col("n") > 1)
        .group_by("stream")
        .agg(pl.col("n").sum())
        .iter_rows()
    )
    for row in m.iter_rows(named=True):
        frac = ties.get(row["stream"], 0) / row["count"]
        assert abs(row["mean"] - row["mean_h"]) <= frac + 1e-9
        if not math.isnan(row["std_h"]):
            assert row["std"] == pytest.approx(row["std_h"], rel=max(0.01, 2 * frac), abs=1e-9)
        for c in ("min", "25%", "50%", "75%", "max"):
            assert abs(row[c] - row[c + "_h"]) <= 1, c


@pytest.mark.parametrize("rel", WITH_DEVICE)
def test_memory_bw_summary(rel):
    r = hta_rank(ours(rel))
    h_ts = hta(rel).get_memory_bw_time_series(ranks=[r]).get(r)
    h_sum = hta(rel).get_memory_bw_summary(ranks=[r])
    o = memory_bw_summary(hta_view_of(rel))
    if h_sum is None or len(h_sum) == 0:
        assert o.is_empty() or h_ts is not None
        return
    h = _describe(h_sum)
    assert set(o["name"]) == set(h["name"])
    m = o.join(h, on="name", suffix="_h")
    residue = h_ts[(h_ts.memory_bw_gbps > 0) & (h_ts.memory_bw_gbps < 1e-6)]
    for row in m.iter_rows(named=True):
        exact = all(
            abs(row[c] - row[c + "_h"]) <= 1e-6 * max(1.0, abs(row[c])) for c in ("count", "mean", "max")
        )
        if not exact:
            assert row["count"] <= row["count_h"] and row["max"] <= row["max_h"] + 1e-9, row["name"]
    if residue.empty:
        # without float residue, only simultaneous end/start can differ; most kinds are exact
        assert sum(abs(a - b) <= 1e-6 for a, b in zip(m["count"], m["count_h"])) >= 1


@pytest.mark.parametrize(
    "rel",
    [
        r
        for r in WITH_DEVICE
        if r.startswith(("amd_trace", "ns_resolution", "nccl_parser", "with_gpu_user_annotation"))
    ],
)
def test_gpu_user_annotations(rel):
    h = hta(rel)
    r = hta_rank(ours(rel))
    v = hta_view_of(rel)
    hb = pd_to_pl(h.get_gpu_user_annotation_breakdown(visualize=False))
    ob = gpu_user_annotation_breakdown(v)
    m = ob.join(hb, on="name", how="full", coalesce=True, suffix="_h")
    assert m.filter(pl.col("count").is_null() | pl.col("sum (us)_h").is_null()).is_empty()
    for c in ("sum (us)", "max (us)", "min (us)", "mean (us)", "stddev"):
        assert ((m[c] - m[c + "_h"]).abs() <= EPS).all(), c

    hk = pd_to_pl(h.get_gpu_kernels_with_user_annotations(rank=r)[["index", "s_user_annotation"]])
    ok = gpu_kernels_with_user_annotations(v).filter(
        pl.col("dur(us)") > 0
    )  # HTA never annotates empty intervals
    m = ok.join(hk.with_columns(pl.col("index").cast(pl.Int64)), left_on="idx", right_on="index", how="inner")
    assert m.height == ok.height
    assert (m["user_annotation"].fill_null("") == m["s_user_annotation"].fill_null("")).all()


def test_two_ranks_together():
    """The only real two-rank set: sampled ranks 0 and 1 of a 128-GPU job, in one TraceAnalysis."""
    import shutil
    import tempfile
    from pathlib import Path

    from hta.trace_analysis import TraceAnalysis
    from hta_parity_support import HTA_DIR

    r0, r1 = "timeline_analysis/sampled_rank-0.json.gz", "trace_filter/sampled_rank-1.json.gz"
    tmp = Path(tempfile.mkdtemp(prefix="kscope-hta2-"))
    try:
        files = {}
        for rank, rel in ((0, r0), (1, r1)):
            dst = tmp / f"rank{rank}.json.gz"
            shutil.copyfile(HTA_DIR / rel, dst)
            files[rank] = str(dst)
        h = TraceAnalysis(trace_files=files, trace_dir=str(tmp), include_last_profiler_step=True)
        views = [hta_view_of(r0, stream_rows_as_device=True), hta_view_of(r1, stream_rows_as_device=True)]
        ht = pd_to_pl(h.get_temporal_breakdown(visualize=False)).sort("rank")
        ot = temporal_breakdown(views)
        assert ot["rank"].to_list() == [0, 1]
        for c in ("idle_time(us)", "compute_time(us)", "non_compute_time(us)", "kernel_time(us)"):
            assert ot[c].to_list() == pytest.approx(ht[c].cast(pl.Float64).to_list(), abs=EPS)
        ho = pd_to_pl(h.get_comm_comp_overlap(visualize=False)).sort("rank")
        assert comm_comp_overlap(views)["comp_comm_overlap_pctg"].to_list() == pytest.approx(
            ho["comp_comm_overlap_pctg"].to_list(), abs=EPS
        )
        # HTA sums the kernel-type table over ranks; ours is per rank
        h_types, _ = h.get_gpu_kernel_breakdown(visualize=False)
        h_t = {r["kernel_type"]: r["sum"] for r in pd_to_pl(h_types).iter_rows(named=True) if r["sum"] > 0}
        o_t = kernel_type_breakdown(views).group_by("kernel_type").agg(pl.col("sum").sum())
        assert dict(o_t.iter_rows()) == pytest.approx(h_t, abs=EPS)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
