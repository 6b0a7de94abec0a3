"""Call graph: nesting with answers known by construction (hypothesis), the tie cases HTA
orders badly or crashes on, kernel attachment and subtree sums, parity with HTA."""

from __future__ import annotations

import random

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kinetoscope.analysis.call_graph import build_call_graph, call_graph_summary

from ._build import TraceBuilder
from .conftest import NS_RESOLUTION, hta_analysis, needs_hta, real

US = 1000
SAMPLED = "trace_filter/sampled_rank-1.json.gz"


# ---- random trees -------------------------------------------------------------------------
@st.composite
def trees(draw):
    """A random forest laid out in time: every node strictly inside its parent, siblings
    disjoint (possibly touching). Returns [(parent index or -1, depth, ts, dur)]."""
    nodes: list[tuple[int, int, int, int]] = []

    def build(parent: int, depth: int, start: int, end: int, budget: list[int]) -> None:
        # children of [start, end): split the span into slots
        n = draw(st.integers(0, 3)) if depth < 5 and budget[0] > 0 else 0
        if n == 0 or end - start < 4 * n:
            return
        cuts = sorted(draw(st.lists(st.integers(start, end), min_size=2 * n, max_size=2 * n)))
        for i in range(n):
            a, b = cuts[2 * i], cuts[2 * i + 1]
            touching = draw(st.booleans())
            if not touching:
                a, b = a + (1 if b - a > 2 else 0), b - (1 if b - a > 2 else 0)
            if b <= a:
                continue
            if budget[0] <= 0:
                return
            budget[0] -= 1
            nodes.append((parent, depth, a, b - a))
            build(len(nodes) - 1, depth + 1, a, b, budget)

    budget = [draw(st.integers(1, 40))]
    t = 0
    for _ in range(draw(st.integers(1, 3))):
        span = draw(st.integers(10, 1000))
        nodes.append((-1, 0, t, span))
        build(len(nodes) - 1, 1, t, t + span, budget)
        t += span + draw(st.integers(0, 5))  # top-level ops may touch
    return nodes


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(tree=trees(), seed=st.integers(0, 10**6))
def test_nesting_known_by_construction(tmp_path, tree, seed):
    b = TraceBuilder()
    # write in parent-before-child order (as Kineto does), with nodes at the same start shuffled
    # only among unrelated events: we keep the generated order, which is a pre-order
    idx_of = []
    for _parent, _depth, ts, dur in tree:
        idx_of.append(b.op(ts * US, dur * US, f"op{len(idx_of)}"))
    # shuffle the file order of top-level trees (any order must give the same answer)
    rnd = random.Random(seed)
    order = list(range(len(b.events)))
    roots = [i for i, (p, *_rest) in enumerate(tree) if p == -1]
    groups = []
    for r_i, r in enumerate(roots):
        end = roots[r_i + 1] if r_i + 1 < len(roots) else len(tree)
        groups.append(order[r:end])
    rnd.shuffle(groups)
    perm = [i for g in groups for i in g]
    b.events = [b.events[i] for i in perm]
    new_idx = {old: new for new, old in enumerate(perm)}
    cg = build_call_graph(b.load(tmp_path, f"t{seed}.json"))
    got = {r["idx"]: (r["parent"], r["depth"]) for r in cg.nodes.iter_rows(named=True)}
    for i, (parent, depth, _ts, _dur) in enumerate(tree):
        want_parent = None if parent < 0 else new_idx[idx_of[parent]]
        assert got[new_idx[idx_of[i]]] == (want_parent, depth)


def test_ties_and_zero_durations(tmp_path):
    """Equal starts: longer first. Touching ops are siblings. A zero-length op at the end of an
    op is inside it when written before the next op starting there, inside the next op when
    written after it. Two zero-length ops at the same time are siblings. A negative duration
    does not break anything (HTA: ValueError: Unexpected case)."""
    b = TraceBuilder()
    a = b.op(0, 10 * US, "A")
    a1 = b.op(0, 4 * US, "A.1")  # same start, shorter: child
    a2 = b.op(4 * US, 6 * US, "A.2")  # touches A.1: sibling; ends with A
    z1 = b.op(10 * US, 0, "Z1")  # zero length at A's end, written before B: in A (and A.2)
    bb = b.op(10 * US, 5 * US, "B")  # touches A: top-level sibling
    z2 = b.op(10 * US, 0, "Z2")  # written after B: inside B
    z3 = b.op(12 * US, 0, "Z3")
    z4 = b.op(12 * US, 0, "Z4")  # same time as Z3: sibling
    neg = b.op(13 * US, -1 * US, "neg")  # malformed: treated as zero length
    cg = build_call_graph(b.load(tmp_path))
    got = {r["idx"]: (r["parent"], r["depth"]) for r in cg.nodes.iter_rows(named=True)}
    assert got[a] == (None, 0)
    assert got[a1] == (a, 1)
    assert got[a2] == (a, 1)
    assert got[z1] == (a2, 2)
    assert got[bb] == (None, 0)
    assert got[z2] == (bb, 1)
    assert got[z3] == (bb, 1) and got[z4] == (bb, 1)
    assert got[neg] == (bb, 1)


def test_kernels_attached_and_summed(tmp_path):
    b = TraceBuilder()
    step = b.annotation(0, 100 * US, "ProfilerStep#3")
    outer = b.op(1 * US, 50 * US, "aten::linear")
    inner = b.op(2 * US, 20 * US, "aten::addmm")
    l1, k1 = b.launch(3 * US, 2 * US, 30 * US, 10 * US, "gemm")
    l2, k2 = b.launch(30 * US, 2 * US, 45 * US, 5 * US, "bias")  # under outer, not inner
    l3, k3 = b.launch(60 * US, 2 * US, 70 * US, 1 * US, "other", stream=9)  # under the step only
    cg = build_call_graph(b.load(tmp_path))
    row = {r["idx"]: r for r in cg.nodes.iter_rows(named=True)}
    assert row[k1]["parent"] == l1 and row[k1]["depth"] == row[l1]["depth"] + 1 and row[k1]["is_device"]
    assert row[inner]["num_kernels"] == 1 and row[inner]["kernel_dur_sum"] == 10 * US
    assert row[outer]["num_kernels"] == 2 and row[outer]["kernel_dur_sum"] == 15 * US
    assert row[outer]["first_kernel_start"] == 30 * US and row[outer]["last_kernel_end"] == 50 * US
    assert row[outer]["kernel_span"] == 20 * US
    assert row[step]["num_kernels"] == 3 and row[step]["kernel_dur_sum"] == 16 * US
    assert row[l3]["num_kernels"] == 1 and row[k3]["height"] == 0 and row[l3]["height"] == 1
    assert row[step]["height"] == 4  # step > linear > addmm > launch > kernel
    leaf = b.op(90 * US, 1 * US, "aten::empty")
    cg = build_call_graph(b.load(tmp_path, "t2.json"))
    r = cg.nodes.filter(pl.col("idx") == leaf).row(0, named=True)
    assert r["num_kernels"] == 0 and r["first_kernel_start"] is None and r["kernel_span"] == 0
    s = call_graph_summary([b.load(tmp_path, "t3.json")])
    assert s.filter(pl.col("name") == "aten::linear")["kernel_dur_sum (us)"].item() == 15.0
    assert s["rank"].to_list() == [0] * s.height


def test_backward_thread_linked_under_main_thread(tmp_path):
    """HTA links top-level ops of the autograd thread under the main thread's ``## backward ##``
    annotation (else ProfilerStep#)."""
    b = TraceBuilder()
    step = b.annotation(0, 100 * US, "ProfilerStep#1", tid=1)
    bwd_ann = b.annotation(50 * US, 40 * US, "## backward ##", tid=1)
    bop = b.op(55 * US, 10 * US, "autograd::engine::evaluate_function: MmBackward0", tid=2)
    child = b.op(56 * US, 5 * US, "aten::mm", tid=2)
    outside = b.op(95 * US, 10 * US, "autograd::engine::evaluate_function: late", tid=2)
    cg = build_call_graph(b.load(tmp_path))
    row = {r["idx"]: r for r in cg.nodes.iter_rows(named=True)}
    assert cg.linked_backward
    assert row[bop]["parent"] == bwd_ann and row[bop]["depth"] == 2
    assert row[child]["depth"] == 3
    assert row[outside]["parent"] is None and row[outside]["depth"] == 0
    assert row[step]["depth"] == 0
    unlinked = build_call_graph(b.load(tmp_path, "u.json"), link_backward=False)
    assert unlinked.nodes.filter(pl.col("idx") == bop)["depth"].item() == 0


def test_ns_resolution_trace_builds():
    """HTA's CallGraph raises ValueError('Unexpected case') on this trace."""
    cg = build_call_graph(real(NS_RESOLUTION))
    host = cg.nodes.filter(~pl.col("is_device"))
    assert host.height > 39000
    dev = cg.nodes.filter(pl.col("is_device"))
    assert dev.height == real(NS_RESOLUTION).device_events().height  # every kernel has its launch


@needs_hta
@pytest.mark.hta
def test_kernel_totals_match_hta():
    """num_kernels / kernel_dur_sum per CPU op equal HTA's new CallGraph on a sampled rank of a
    128-GPU job (no cuda_sync rows there; HTA drops the last step, so only events both keep are
    compared)."""
    from hta.common.trace_call_graph import CallGraph as HtaCallGraph

    ta = hta_analysis(SAMPLED, 1)
    HtaCallGraph(ta.t, ranks=[1])
    df = ta.t.get_trace(1)
    h = pl.DataFrame(
        {
            "idx": df["index"].to_numpy().astype(np.int64),
            "h_num": df["num_kernels"].to_numpy().astype(np.int64),
            "h_sum": df["kernel_dur_sum"].to_numpy().astype(np.int64),
            "h_stream": df["stream"].to_numpy().astype(np.int64),
        }
    ).filter(pl.col("h_stream") == -1)
    cg = build_call_graph(real(SAMPLED))
    last_step = real(SAMPLED).events.filter(pl.col("name").str.starts_with("ProfilerStep#"))["ts"].max()
    j = cg.nodes.filter(~pl.col("is_device") & (pl.col("ts") + pl.col("dur") < last_step)).join(h, on="idx")
    assert j.height > 1500
    assert (j["num_kernels"] == j["h_num"]).all()
    assert (j["kernel_dur_sum"] == j["h_sum"] * US).all()
