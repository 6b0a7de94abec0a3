"""Critical path: exact parity with HTA on its four critical-path traces, HTA's own unit-test
expectations, overlays, and synthetic graphs whose critical path is known by construction."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import numpy as np
import polars as pl
import pytest

from kinetoscope.analysis.critical_path import (
    CPU_BOUND,
    EDGE_TYPES,
    GPU_COMPUTE_BOUND,
    GPU_KERNEL_KERNEL_OVERHEAD,
    GPU_KERNEL_LAUNCH_OVERHEAD,
    KERNEL_KERNEL_DELAY,
    KERNEL_LAUNCH_DELAY,
    OPERATOR_KERNEL,
    SYNC_DEPENDENCY,
    CriticalPathError,
    _dag_longest_path,
    critical_path,
    critical_path_summary,
)

from ._build import TraceBuilder
from .conftest import (
    ALEXNET,
    CP_ANNOTATION,
    EVENT_SYNC,
    EVENT_SYNC_MULTI,
    HTA_DIR,
    NS_RESOLUTION,
    SIMPLE_ADD,
    SIMPLE_ADD_OVERLAY,
    hta_critical_path,
    needs_hta,
    real,
)

US = 1000

PARITY_CASES = [
    (SIMPLE_ADD, CP_ANNOTATION, 1),
    (ALEXNET, CP_ANNOTATION, 1),
    (EVENT_SYNC, "ProfilerStep", 0),
    (EVENT_SYNC_MULTI, "", None),
]


def _ours(rel: str, annotation: str, instance, zero: bool = True):
    return critical_path(real(rel), annotation, instance, add_zero_weight_launch_edges=zero)


def _edge_dict(cp) -> dict:
    out = {}
    for u, v, t, w, a in zip(
        cp.edge_src.tolist(),
        cp.edge_dst.tolist(),
        cp.edge_type.tolist(),
        cp.edge_weight.tolist(),
        cp.edge_attr.tolist(),
    ):
        out[(u, v)] = (EDGE_TYPES[t], w // US, None if a < 0 else a)
    return out


# ---- HTA's own expectations (tests/test_critical_path_analysis.py at f4d0062) ----------------
def test_simple_add_expected_values():
    cp = _ours(SIMPLE_ADD, CP_ANNOTATION, 1)
    assert cp.success
    assert len(cp.path_nodes) == 315
    assert len(cp.path_edges) == 314
    assert len(cp.critical_events) == 159
    # aten::relu_ > aten::clamp_min_ > cudaLaunchKernel
    # (HTA's test hard-codes node ids 32..37 from a later HTA; with 0.6.1, whose node list ours
    # equals, they are 57..62: only the edges are checked here)
    relu, clamp, launch = 286, 287, 1005
    (rs_, re_), (cs_, ce_), (ls_, le_) = (cp.nodes_for_event(e) for e in (relu, clamp, launch))
    assert rs_ < cs_ < ls_ < le_ < ce_ < re_
    expect = [
        ((rs_, cs_), 15, relu),
        ((cs_, ls_), 14, clamp),
        ((ls_, le_), 17, launch),
        ((le_, ce_), 15, clamp),
        ((ce_, re_), 32, relu),
    ]
    for (u, v), w_us, ev in expect:
        e = cp.edge(u, v)
        assert e["type"] == OPERATOR_KERNEL and e["weight"] == w_us * US and e["event_idx"] == ev
    # launch delay, kernel-kernel delay and the zero-weight causal launch edge
    fft_kernel, fft_runtime = 1051, 1053
    ks, ke = cp.nodes_for_event(fft_kernel)
    rs, _ = cp.nodes_for_event(fft_runtime)
    assert cp.edge(rs, ks)["type"] == KERNEL_LAUNCH_DELAY and cp.edge(rs, ks)["weight"] == 27 * US
    k2s, _ = cp.nodes_for_event(1067)
    assert cp.edge(ke, k2s)["type"] == KERNEL_KERNEL_DELAY and cp.edge(ke, k2s)["weight"] == 7 * US
    r2s, _ = cp.nodes_for_event(1069)
    assert cp.edge(r2s, k2s)["type"] == KERNEL_LAUNCH_DELAY and cp.edge(r2s, k2s)["weight"] == 0
    # cudaDeviceSynchronize waits for the last kernel
    _, k3e = cp.nodes_for_event(1275)
    _, se = cp.nodes_for_event(1281)
    assert cp.edge(k3e, se)["type"] == SYNC_DEPENDENCY and cp.edge(k3e, se)["weight"] == 0
    # every operator / kernel-kernel edge is attributed, no other edge is
    attributed = cp.edge_attr >= 0
    kinds = np.isin(cp.edge_type, [EDGE_TYPES.index(OPERATOR_KERNEL), EDGE_TYPES.index(KERNEL_KERNEL_DELAY)])
    assert (attributed == kinds).all()


def test_alexnet_expected_values():
    cp = _ours(ALEXNET, CP_ANNOTATION, 1)
    assert cp.success and len(cp.path_nodes) == 149
    # GPU->GPU sync from cudaStreamWaitEvent: fft kernel on stream 20 -> elementwise on stream 7
    _, src_end = cp.nodes_for_event(1109)
    dst_start, _ = cp.nodes_for_event(1161)
    assert cp.edge(src_end, dst_start) == {
        "src": src_end,
        "dst": dst_start,
        "type": SYNC_DEPENDENCY,
        "weight": 0,
        "event_idx": None,
    }
    summary = cp.summary()
    assert summary.height == 5
    bd = cp.breakdown()
    assert bd.height == len(cp.path_edges)
    assert bd["bound_by"].null_count() == 0
    assert set(summary["bound_by"]) == {
        "",
        CPU_BOUND,
        GPU_COMPUTE_BOUND,
        GPU_KERNEL_KERNEL_OVERHEAD,
        GPU_KERNEL_LAUNCH_OVERHEAD,
    }
    assert summary["percentage"].sum() == pytest.approx(100.0)


def test_event_sync_edges():
    cp = _ours(EVENT_SYNC, "ProfilerStep", 0)
    _, k_end = cp.nodes_for_event(33)
    for rt in (41, 51):  # cudaEventSynchronize, cudaDeviceSynchronize
        _, rt_end = cp.nodes_for_event(rt)
        assert cp.edge(k_end, rt_end)["type"] == SYNC_DEPENDENCY


def test_event_sync_multi_stream_edge():
    cp = _ours(EVENT_SYNC_MULTI, "", None)
    _, k1_end = cp.nodes_for_event(24)  # ampere_sgemm on stream 20
    k3_start, _ = cp.nodes_for_event(84)  # Memset on stream 24, after cudaStreamWaitEvent
    assert cp.edge(k1_end, k3_start)["type"] == SYNC_DEPENDENCY


# ---- live parity ---------------------------------------------------------------------------
@needs_hta
@pytest.mark.hta
@pytest.mark.parametrize("rel,annotation,instance", PARITY_CASES)
@pytest.mark.parametrize("zero", [True, False])
def test_graph_and_path_identical_to_hta(rel, annotation, instance, zero):
    h = hta_critical_path(rel, annotation, instance, zero)
    cp = _ours(rel, annotation, instance, zero)
    assert cp.success == h["ok"]
    assert list(zip(cp.node_ev.tolist(), cp.node_is_start.tolist())) == h["node_list"]
    assert cp.num_graph_nodes == h["num_graph_nodes"]
    assert _edge_dict(cp) == h["edges"]
    assert cp.path_nodes.tolist() == h["path"]
    assert sorted(cp.critical_events) == h["critical_events"]
    ours = {r["bound_by"]: r["percentage"] for r in cp.summary().iter_rows(named=True)}
    assert ours.keys() == h["summary"].keys()
    for k, v in h["summary"].items():
        assert ours[k] == pytest.approx(v, abs=1e-9)


# ---- overlay ---------------------------------------------------------------------------------
def _read(path):
    with gzip.open(path, "rt") as fh:
        return json.load(fh)["traceEvents"]


def test_overlay_matches_hta_counts(tmp_path):
    cp = _ours(SIMPLE_ADD, CP_ANNOTATION, 1)
    src = HTA_DIR / SIMPLE_ADD
    before = src.read_bytes()
    out = cp.overlay(tmp_path, only_show_critical_events=False, show_all_edges=True)
    assert out.endswith("overlaid_critical_path_trace.json.gz")
    assert src.read_bytes() == before  # input untouched
    events = _read(out)
    marked = sum(e["args"].get("critical", 0) for e in events if "args" in e and e["ph"] == "X")
    assert marked == 159
    flows = Counter(e["cat"] for e in events if "critical_path" in e.get("cat", ""))
    shown = [
        t
        for t, w in zip(cp.edge_type.tolist(), cp.edge_weight.tolist())
        if not (EDGE_TYPES[t] == KERNEL_LAUNCH_DELAY and w == 0)
    ]
    assert flows["critical_path"] == 2 * len(shown)
    assert sum(e["args"].get("critical", 0) for e in events if "args" in e and e.get("ph") == "f") == 314

    out2 = cp.overlay(tmp_path / "only.json.gz", only_show_critical_events=True, show_all_edges=True)
    events = _read(out2)
    checked = [
        e for e in events if e["ph"] == "X" and e.get("cat", "") not in ("user_annotation", "python_function")
    ]
    assert len(checked) == 159 and all(e["args"].get("critical") == 1 for e in checked)
    flows = [e for e in events if e.get("cat") == "critical_path"]
    assert flows and all(e["args"]["critical"] for e in flows)


def test_overlay_identical_to_hta_output_file(tmp_path):
    """HTA's end-to-end expected output (whole trace, no zero-weight launch edges, all events
    kept): the same 624 critical events and the same 192 flow arrows."""
    expected = _read(HTA_DIR / SIMPLE_ADD_OVERLAY)
    hta_flows = [e for e in expected if e.get("cat") == "critical_path"]
    assert len(hta_flows) == 384
    hta_critical = [
        i for i, e in enumerate(expected) if e.get("ph") == "X" and e.get("args", {}).get("critical") == 1
    ]
    cp = critical_path(real(SIMPLE_ADD), "", None)
    events = _read(cp.overlay(tmp_path, only_show_critical_events=False))
    critical = [
        i for i, e in enumerate(events) if e.get("ph") == "X" and e.get("args", {}).get("critical") == 1
    ]
    assert critical == hta_critical
    flows = [e for e in events if e.get("cat") == "critical_path"]
    key = lambda e: (e["ph"], e["pid"], e["tid"], e["ts"], e["args"]["type"], e["args"]["weight"])  # noqa: E731
    assert sorted(map(key, flows)) == sorted(map(key, hta_flows))


def test_overlay_refuses_to_overwrite_input():
    cp = _ours(EVENT_SYNC, "ProfilerStep", 0)
    with pytest.raises(ValueError):
        cp.overlay(HTA_DIR / EVENT_SYNC)


# ---- robustness ------------------------------------------------------------------------------
def test_ns_resolution_trace_runs():
    """HTA needs µs rounding here (and its CallGraph crashes on this trace for other analyses)."""
    cp = critical_path(real(NS_RESOLUTION), "ProfilerStep", 1)
    assert cp.success and len(cp.path_nodes) > 1000
    s = {r["bound_by"]: r["percentage"] for r in cp.summary().iter_rows(named=True)}
    # HTA (after its µs rounding): gpu_compute_bound 97.87 %, kernel-kernel overhead 2.13 %
    assert s[GPU_COMPUTE_BOUND] > 95


def test_missing_annotation_and_bad_instance():
    t = real(EVENT_SYNC)
    with pytest.raises(CriticalPathError):
        critical_path(t, "NoSuchAnnotation", 0)
    with pytest.raises(CriticalPathError):
        critical_path(t, "ProfilerStep", 5)


def test_registry_summary_defaults_to_first_step():
    df = critical_path_summary([real(EVENT_SYNC)])
    assert set(df.columns) == {"rank", "bound_by", "duration (us)", "percentage"}
    assert df["rank"].to_list() == [0] * df.height
    assert df["percentage"].sum() == pytest.approx(100.0)


# ---- known by construction -----------------------------------------------------------------
def test_chain_of_kernels(tmp_path):
    """One op launches three kernels back to back; a device sync waits for the last one, then
    the CPU runs one more op.

    CPU:  step [0, 110us]: op [0, 30] with launches at 0, 10, 20 (5us each); sync [30, 90];
          after [92, 100]
    GPU:  k1 [6, 36], k2 [40, 60], k3 [62, 80] on one stream (4 us and 2 us gaps)
    Path: op start -> launch1 start -> k1 (launch delay 6) -> k2 (gap 4) -> k3 (gap 2) -> k3 end
          -> sync end (0) -> after start (0) -> after end (8): 88 us.
    """
    b = TraceBuilder()
    step = b.annotation(0, 110 * US, "ProfilerStep#1")
    op = b.op(0, 30 * US, "aten::fused")
    _, k1 = b.launch(0, 5 * US, 6 * US, 30 * US, "k1")
    _, k2 = b.launch(10 * US, 5 * US, 40 * US, 20 * US, "k2")
    _, k3 = b.launch(20 * US, 5 * US, 62 * US, 18 * US, "k3")
    b._corr += 1
    sync = b.runtime(30 * US, 60 * US, "cudaDeviceSynchronize", correlation=b._corr)
    b.gpu(30 * US, 50 * US, "Context Sync", correlation=b._corr, stream=-1, cat="cuda_sync")
    after = b.op(92 * US, 8 * US, "aten::after")
    cp = critical_path(b.load(tmp_path), "ProfilerStep", 0)
    assert cp.success
    crit = cp.critical_events
    assert {op, k1, k2, k3, sync, after} <= crit
    assert step not in crit  # user annotations are not graph nodes
    assert cp.length_ns == 88 * US
    bd = cp.breakdown()
    by = dict(bd.group_by("bound_by").agg(pl.col("duration_ns").sum()).iter_rows())
    assert by[GPU_KERNEL_LAUNCH_OVERHEAD] == 6 * US
    assert by[GPU_KERNEL_KERNEL_OVERHEAD] == (4 + 2) * US
    assert by[GPU_COMPUTE_BOUND] == (30 + 20 + 18) * US
    assert by[CPU_BOUND] == 8 * US
    assert bd["type"].to_list().count(SYNC_DEPENDENCY) == 1


def test_cpu_only_path_is_the_thread(tmp_path):
    """Without GPU work the critical path walks the CPU thread: total = busy CPU time."""
    b = TraceBuilder()
    b.op(0, 10 * US, "a")
    b.op(2 * US, 3 * US, "a.child")
    b.op(20 * US, 5 * US, "b")
    cp = critical_path(b.load(tmp_path), None)
    assert cp.length_ns == (10 + 5) * US
    assert set(cp.summary()["bound_by"]) <= {"", CPU_BOUND}


def test_longest_path_matches_networkx_on_random_dags():
    nx = pytest.importorskip("networkx")
    rng = np.random.default_rng(7)
    for _ in range(40):
        n = int(rng.integers(2, 40))
        m = int(rng.integers(1, 3 * n))
        u = rng.integers(0, n - 1, size=m)
        v = u + rng.integers(1, n, size=m)
        keep = v < n
        pairs = list(dict.fromkeys(zip(u[keep].tolist(), v[keep].tolist())))
        if not pairs:
            continue
        w = rng.integers(0, 4, size=len(pairs))  # many ties
        g = nx.DiGraph()
        for (a, b), ww in zip(pairs, w.tolist()):
            g.add_edge(a, b, weight=ww)
        src = np.array([p[0] for p in pairs])
        dst = np.array([p[1] for p in pairs])
        ours = _dag_longest_path(n, src, dst, w.astype(np.int64)).tolist()
        assert ours == nx.dag_longest_path(g, weight="weight")
