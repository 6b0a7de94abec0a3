"""ATen op -> kernels, CUPTI counters, and the registry entries of the heavy analyses."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kinetoscope.analysis import registry, run_analyses
from kinetoscope.analysis.aten_op_kernels import aten_op_kernels_and_delay, aten_op_launches
from kinetoscope.analysis.cupti_counters import (
    CUDA_SASS_INSTRUCTION_COUNTER_FLOPS,
    counter_data_with_operators,
)

from ._build import TraceBuilder
from .conftest import ALEXNET, CUPTI, HTA_DIR, hta_analysis, hta_like, needs_hta, real

US = 1000
HEAVY = [
    "call_graph",
    "frequent_kernel_sequences",
    "critical_path",
    "critical_path_breakdown",
    "memory_summary",
    "memory_allocation_sites",
    "memory_timeline",
    "aten_op_kernels",
    "cupti_counters",
]


# ---- ATen op kernels ---------------------------------------------------------------------
def test_aten_op_kernels_known_by_construction(tmp_path):
    b = TraceBuilder()
    for i in range(3):
        t = i * 100 * US
        b.op(t, 50 * US, "aten::linear")
        b.op(t + 2 * US, 40 * US, "aten::addmm")
        b.launch(t + 5 * US, 3 * US, t + 20 * US, 5 * US, "gemm")  # op delay 3, runtime 15
        b.launch(t + 10 * US, 3 * US, t + 30 * US, 5 * US, "bias")
    b.op(400 * US, 10 * US, "aten::relu")
    b.launch(401 * US, 2 * US, 410 * US, 1 * US, "relu_kernel")
    b.launch(500 * US, 2 * US, 510 * US, 1 * US, "orphan")  # not inside an aten op
    b.op(600 * US, 10 * US, "aten::other", tid=7)
    b.launch(601 * US, 2 * US, 610 * US, 1 * US, "other_thread")  # aten op on another thread
    df = aten_op_kernels_and_delay(b.load(tmp_path))
    assert df.to_dicts() == [
        {
            "aten_op_name": "aten::addmm",
            "kernel_sequence": "gemm -> bias",
            "occurrence_count": 3,
            "avg_aten_op_launch_delay": 3.0,
            "avg_runtime_delay": 15.0,
        },
        {
            "aten_op_name": "aten::relu",
            "kernel_sequence": "relu_kernel",
            "occurrence_count": 1,
            "avg_aten_op_launch_delay": 1.0,
            "avg_runtime_delay": 9.0,
        },
    ]


@needs_hta
@pytest.mark.hta
def test_aten_op_kernels_match_hta():
    import plotly.graph_objects as go

    show = go.Figure.show
    go.Figure.show = lambda self, *a, **k: None  # HTA always renders a table
    try:
        h = hta_analysis(ALEXNET, 0).get_aten_op_kernels_and_delay(ranks=[0])[0]
    finally:
        go.Figure.show = show
    ours = aten_op_kernels_and_delay(hta_like(real(ALEXNET)))
    hk = {
        (r.aten_op_name, r.kernel_sequence): (
            r.occurrence_count,
            r.avg_aten_op_launch_delay,
            r.avg_runtime_delay,
        )
        for r in h.itertuples()
    }
    mk = {(r[0], r[1]): (r[2], r[3], r[4]) for r in ours.iter_rows()}
    assert hk == mk


def test_aten_op_launches_rows():
    rows = aten_op_launches(real(ALEXNET))
    assert rows.height > 0
    assert (rows["runtime_start"] >= rows["aten_op_start"]).all()
    assert (rows["aten_op_delay"] == rows["runtime_start"] - rows["aten_op_start"]).all()


# ---- CUPTI counters ---------------------------------------------------------------------
def test_cupti_counters_rows():
    df = counter_data_with_operators(real(CUPTI))
    assert df.height == 77
    counters = [c for c in df.columns if c.startswith("smsp__")]
    assert len(counters) == 9
    assert (df["top_level_op"] == df["op_stack"].list.first()).all()
    first = df.row(0, named=True)
    assert first["op_stack"][:2] == ["aten::rand", "aten::uniform_"]
    want = sum(first[k] * w for k, w in CUDA_SASS_INSTRUCTION_COUNTER_FLOPS.items())
    assert first["flops"] == pytest.approx(want)


@needs_hta
@pytest.mark.hta
def test_cupti_counters_match_hta():
    h = hta_analysis(CUPTI, 0).get_cupti_counter_data_with_operators(ranks=[0])[0].sort_values("ts")
    ours = counter_data_with_operators(real(CUPTI))
    assert ours["idx"].to_list() == h["index"].tolist()
    assert ours["index_runtime"].to_list() == h["index_runtime"].tolist()
    assert ours["op_stack"].to_list() == [list(x) for x in h["op_stack"]]
    assert ours["bottom_level_op"].to_list() == h["bottom_level_op"].tolist()
    for c in (c for c in h.columns if c.startswith("smsp__")):
        assert ours[c].to_list() == [float(v) for v in h[c]]


def test_cupti_count_mismatch_gives_no_rows(tmp_path):
    b = TraceBuilder()
    b.op(0, 10 * US, "aten::mm")
    b.runtime(1 * US, 2 * US, "cudaLaunchKernel", correlation=5)
    b.events.append(
        {
            "ph": "X",
            "cat": "cuda_profiler_range",
            "name": "k",
            "pid": 0,
            "tid": 0,
            "ts": 5,
            "dur": 1,
            "args": {"smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 10},
        }
    )
    b.events.append(
        {
            "ph": "X",
            "cat": "cuda_profiler_range",
            "name": "k2",
            "pid": 0,
            "tid": 0,
            "ts": 7,
            "dur": 1,
            "args": {},
        }
    )
    assert counter_data_with_operators(b.load(tmp_path)).is_empty()
    b.events.pop()
    df = counter_data_with_operators(b.load(tmp_path, "ok.json"))
    assert df.height == 1 and df["op_stack"].to_list() == [["aten::mm"]] and df["flops"].item() == 20.0


# ---- registry ---------------------------------------------------------------------------------
def test_registered_and_not_default():
    names = registry.names()
    for n in HEAVY:
        assert n in names
        assert not registry.get(n).default
    assert not set(HEAVY) & set(registry.default_names())


def test_run_through_the_runner():
    res = run_analyses([real(ALEXNET)], HEAVY, {"operator_name": "aten::conv2d", "outermost": False})
    assert not res.errors, res.errors
    for n in (
        "call_graph",
        "frequent_kernel_sequences",
        "critical_path",
        "critical_path_breakdown",
        "aten_op_kernels",
    ):
        assert res[n].height > 0 and "rank" in res[n].columns, n
    assert res["memory_summary"].is_empty() and "memory_summary" in res.notes
    cupti = run_analyses([real(CUPTI)], ["cupti_counters"])
    assert cupti["cupti_counters"].height == 77


def test_kscope_analyze_only_critical_path_json():
    from kinetoscope.cli.main import app

    res = CliRunner().invoke(app, ["analyze", str(HTA_DIR / ALEXNET), "--only", "critical_path", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    rows = doc["critical_path"]
    assert {r["bound_by"] for r in rows} >= {"cpu_bound", "gpu_compute_bound"}
    assert sum(r["percentage"] for r in rows) == pytest.approx(100.0)
