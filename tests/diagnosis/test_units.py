"""Unit tests: peak-FLOPs table, FLOP estimates, detectors, job assembly."""

from __future__ import annotations

import polars as pl
import pytest
from diag_synth import MS, make_job

from kinetoscope.diagnosis import EXTRA_KEYS, diagnose
from kinetoscope.diagnosis.assembly import assemble_jobs, name_pattern
from kinetoscope.diagnosis.detectors import detect_attention, detect_compilation
from kinetoscope.diagnosis.mfu import PEAK_FLOPS, estimate_op_flops, match_device
from kinetoscope.trace.model import Trace, TraceMeta
from kinetoscope.trace.schema import EVENTS_SCHEMA


@pytest.mark.parametrize(
    ("name", "cus", "key"),
    [
        ("NVIDIA H100 80GB HBM3", 132, "H100 SXM"),
        ("NVIDIA H100 PCIe", 114, "H100 PCIe"),
        ("NVIDIA H100 NVL", 132, "H100 NVL"),
        ("NVIDIA H200", 132, "H200 SXM"),
        ("NVIDIA H200 NVL", 132, "H200 NVL"),
        ("NVIDIA H800", 132, "H800 SXM"),
        ("NVIDIA H800 PCIe", 114, "H800 PCIe"),
        ("NVIDIA B200", 148, "B200"),
        ("NVIDIA A100-SXM4-80GB", 108, "A100"),
        ("NVIDIA A100-PG509-200", 108, "A100"),
        ("Tesla V100-SXM2-32GB", 80, "V100 SXM2"),
        ("Tesla V100-PCIE-16GB", 80, "V100 PCIe"),
        ("AMD Instinct MI300X", 304, "MI300X"),
        ("AMD Instinct MI250X / MI250", 104, "MI250 (per GCD)"),
        ("AMD Instinct MI250X / MI250", 110, "MI250X (per GCD)"),
        ("AMD Radeon Graphics", 104, "MI250 (per GCD)"),
        ("AMD Radeon Graphics", 304, "MI300X"),
        ("NVIDIA GeForce RTX 4090", 128, None),
        ("Quadro GP100", 56, None),
    ],
)
def test_device_table(name, cus, key):
    assert match_device(name, cus) == key


def test_peak_table_complete_and_dense():
    for key, peaks in PEAK_FLOPS.items():
        assert set(peaks) == {"bf16", "fp16", "tf32", "fp32"}, key
    assert PEAK_FLOPS["H100 SXM"]["bf16"] == pytest.approx(989.4e12)  # dense, not the 2:4-sparse 1979
    assert PEAK_FLOPS["A100"]["tf32"] == pytest.approx(156e12)


@pytest.mark.parametrize(
    ("name", "dims", "concrete", "flops"),
    [
        ("aten::mm", "[[4,8],[8,16]]", None, 2 * 4 * 8 * 16),
        ("aten::addmm", "[[16],[4,8],[8,16]]", None, 2 * 4 * 8 * 16),
        ("aten::bmm", "[[3,4,8],[3,8,16]]", None, 2 * 3 * 4 * 8 * 16),
        ("aten::baddbmm", "[[3,4,16],[3,4,8],[3,8,16]]", None, 2 * 3 * 4 * 8 * 16),
        (
            "aten::convolution",
            "[[4,3,8,8],[8,3,3,3],[8],[],[],[],[],[],[]]",
            '["","","","[1, 1]","[0, 0]","[1, 1]","False","[0, 0]","1"]',
            2 * 4 * 8 * 6 * 6 * 3 * 9,
        ),
        (
            "aten::convolution",
            "[[4,3,8,8],[8,3,3,3],[8],[],[],[],[],[],[]]",
            '["","","","[2, 2]","[1, 1]","[1, 1]","False","[0, 0]","1"]',
            2 * 4 * 8 * 4 * 4 * 3 * 9,
        ),
        (
            "aten::convolution_backward",
            "[[4,8,6,6],[4,3,8,8],[8,3,3,3],[],[],[],[],[],[],[],[]]",
            '["","","","[8]","[1, 1]","[0, 0]","[1, 1]","False","[0, 0]","1","[True, True, True]"]',
            2 * (2 * 4 * 8 * 36 * 3 * 9),
        ),
        (
            "aten::_scaled_dot_product_flash_attention",
            "[[2,4,16,8],[2,4,32,8],[2,4,32,8]]",
            None,
            4 * 8 * 16 * 32 * 8,
        ),
        ("aten::relu", "[[4,8]]", None, None),
        ("aten::mm", None, None, None),
    ],
)
def test_flop_estimates(name, dims, concrete, flops):
    assert estimate_op_flops(name, dims, concrete) == flops


def test_mfu_formula_and_table():
    d = diagnose(make_job(2, 6, flavour="nccl", device_name="NVIDIA H100 80GB HBM3"), model_flops=4e13)
    m = d.mfu
    assert (
        m.device_key == "H100 SXM" and m.precision == "bf16" and m.peak_source == "table: H100 SXM bf16 dense"
    )
    assert m.chips == 2 and m.flops_source == "model_flops"
    assert m.mfu == pytest.approx(4e13 / m.step_time_s / 2 / 989.4e12)
    assert d.to_dict()["mfu"]["formula"].startswith("MFU = FLOPS_per_step / step_time_s / chip_count")
    low = [r for r in d.recommendations if r["id"] == "low-mfu"]
    assert low and low[0]["evidence"]["mfu"] == pytest.approx(m.mfu, abs=1e-4)
    assert "batch" in low[0]["action"]


def test_mfu_says_when_the_trace_names_no_device():
    d = diagnose(make_job(2, 6, flavour="nccl"), model_flops=4e13)
    assert d.mfu.mfu is None and d.mfu.device is None
    assert "no deviceProperties" in d.mfu.reason and "--peak-flops" in d.mfu.reason
    d = diagnose(make_job(2, 6, flavour="nccl", device_name="Imaginary X9"), model_flops=4e13)
    assert "'Imaginary X9' is not in the peak-FLOPs table" in d.mfu.reason


def test_mfu_cpu_not_applicable_unless_peak_given():
    d = diagnose(make_job(2, 6), model_flops=1e9)
    assert d.mfu.mfu is None and "CPU-only" in d.mfu.reason
    d = diagnose(make_job(2, 6), model_flops=1e9, peak_flops=1e11)
    assert d.mfu.mfu == pytest.approx(1e9 / d.mfu.step_time_s / 2 / 1e11)


# ---- detectors ----------------------------------------------------------------------------------


def _trace(rows: list[dict]) -> Trace:
    full = []
    for i, r in enumerate(rows):
        row = dict.fromkeys(EVENTS_SCHEMA)
        row.update({"idx": i, "pid": 1, "tid": 1, "cat": r["kind"], **r})
        full.append(row)
    return Trace(
        meta=TraceMeta(path="/x/rank-0.json", rank=0),
        events=pl.DataFrame(full, schema=EVENTS_SCHEMA, orient="row"),
    )


def test_attention_math_path_detected():
    t = _trace(
        [{"kind": "cpu_op", "name": "aten::_scaled_dot_product_attention_math", "ts": 0, "dur": 5 * MS}]
    )
    assert detect_attention(t).math_path
    t = _trace(
        [
            {
                "kind": "cpu_op",
                "name": "aten::matmul",
                "ts": 0,
                "dur": 100,
                "input_dims": "[[2,4,16,8],[2,4,8,16]]",
            },
            {
                "kind": "cpu_op",
                "name": "aten::softmax",
                "ts": 200,
                "dur": 100,
                "input_dims": "[[2,4,16,16],[],[]]",
            },
            {
                "kind": "cpu_op",
                "name": "aten::matmul",
                "ts": 400,
                "dur": 100,
                "input_dims": "[[2,4,16,16],[2,4,16,8]]",
            },
        ]
    )
    f = detect_attention(t)
    assert f.manual_patterns == 1 and f.math_path
    # a 2-D softmax between matmuls (e.g. gating) is not attention
    t = _trace(
        [
            {"kind": "cpu_op", "name": "aten::matmul", "ts": 0, "dur": 100, "input_dims": "[[2048,2],[2,1]]"},
            {"kind": "cpu_op", "name": "aten::softmax", "ts": 200, "dur": 100, "input_dims": "[[2,1],[],[]]"},
            {
                "kind": "cpu_op",
                "name": "aten::matmul",
                "ts": 400,
                "dur": 100,
                "input_dims": "[[2048,2],[2,1]]",
            },
        ]
    )
    assert not detect_attention(t).math_path
    # fused kernels present: not the math path
    t = _trace(
        [
            {"kind": "cpu_op", "name": "aten::_scaled_dot_product_attention_math", "ts": 0, "dur": 100},
            {"kind": "cpu_op", "name": "aten::_scaled_dot_product_flash_attention", "ts": 200, "dur": 100},
        ]
    )
    assert not detect_attention(t).math_path


def test_recompilation_detected():
    t = _trace(
        [
            {"kind": "cpu_op", "name": "TorchDynamo Cache Lookup", "ts": 0, "dur": 10},
            {
                "kind": "user_annotation",
                "name": "entire_frame_compile_data: fn_name=_compile.compile_inner, compile_id=0/1",
                "ts": 20,
                "dur": 40 * MS,
            },
            {"kind": "cpu_op", "name": "Torch-Compiled Region: 0/0", "ts": 50 * MS, "dur": 100},
            {"kind": "cpu_op", "name": "Torch-Compiled Region: 0/1", "ts": 60 * MS, "dur": 100},
        ]
    )
    f = detect_compilation(t)
    assert f.recompiles == 1 and f.frames == {0} and f.compile_time_us == pytest.approx(40_000)
    assert f.compiles_in_window == 1 and f.cache_lookups == 1


# ---- assembly -----------------------------------------------------------------------------------


def _meta_trace(path: str, rank: int | None, world: int | None, job: str | None = None, n: int = 1) -> Trace:
    t = _trace([{"kind": "cpu_op", "name": "aten::mm", "ts": i, "dur": 1} for i in range(n)])
    t.meta = TraceMeta(
        path=path,
        rank=rank,
        world_size=world,
        job_id=job,
        rank_source="manifest" if rank is not None else "unknown",
    )
    return t


def test_assembly_missing_duplicate_and_grouping():
    traces = [
        _meta_trace("/a/rank-0_11.pt.trace.json", 0, 8, "j1"),
        _meta_trace("/a/rank-1_12.pt.trace.json", 1, 8, "j1"),
        _meta_trace("/b/rank-1_13.pt.trace.json", 1, 8, "j1", n=5),
        _meta_trace("/a/rank-5_14.pt.trace.json", 5, 8, "j1"),
        _meta_trace("/c/other-0.json", 0, 2, "j2"),
        _meta_trace("/a/unknown.json", None, None, "j1"),
    ]
    jobs = assemble_jobs(traces)
    assert [j.job_id for j in jobs] == ["j1", "j2"]
    j = jobs[0]
    assert j.ranks == [0, 1, 5] and j.world_size == 8
    assert j.missing_ranks == [2, 3, 4, 6, 7]
    assert j.traces[1].meta.path == "/b/rank-1_13.pt.trace.json"  # more events kept
    assert j.duplicates == {1: ["/a/rank-1_12.pt.trace.json"]}
    assert j.unranked == ["/a/unknown.json"]
    d = j.to_dict()
    assert d["num_missing_ranks"] == 5 and d["duplicate_ranks"] == {"1": ["/a/rank-1_12.pt.trace.json"]}


def test_assembly_without_world_size_or_ranks():
    j = assemble_jobs([_meta_trace("/x/w0.json", 0, None), _meta_trace("/x/w3.json", 3, None)])[0]
    assert j.world_size == 4 and j.world_size_source == "inferred" and j.missing_ranks == [1, 2]
    j = assemble_jobs(
        [
            _meta_trace("/x/nodeB_7.pt.trace.json", None, None),
            _meta_trace("/x/nodeA_9.pt.trace.json", None, None),
        ]
    )[0]
    assert j.ranks == [0, 1] and j.traces[0].meta.path == "/x/nodeA_9.pt.trace.json"
    assert j.traces[0].meta.rank_source == "file order"


def test_name_pattern():
    assert name_pattern("/x/rank-3_4242.pt.trace.json") == "rank-#_#.pt.trace.json"
    assert name_pattern("sampled_rank-12.json.gz") == "sampled_rank-#.json.gz"


def test_runner_hook_builds_the_diagnosis_document_once(monkeypatch):
    from kinetoscope.analysis.runner import AnalysisResults, build_document
    from kinetoscope.diagnosis import builders
    from kinetoscope.diagnosis.document import run_diagnosis

    calls = []
    real = builders.build_parts

    def counting(ctx, order=builders.BUILDERS):
        calls.append(1)
        return real(ctx, order)

    monkeypatch.setattr(builders, "build_parts", counting)
    traces = make_job(4, 6)
    res = AnalysisResults()
    diag = run_diagnosis(traces, res)
    assert len(calls) == 1 and not res.errors
    # the first contract's keys, then the keys added since (pipeline, uneven_inputs, recompilation)
    assert set(diag) == {"summary", "job", "steps", "stragglers", "mfu", "recommendations", *EXTRA_KEYS}
    doc = build_document(traces, res, diagnosis=diag)
    assert doc["diagnosis_summary"][0].startswith("NO STRAGGLER") and doc["steps"][0]["rank"] == 0
    # as a Mapping (any consumer): every key read costs one document, built once
    d = diagnose(traces)
    calls.clear()
    assert dict(d)["job"]["world_size"] == 4 and list(d) == [
        "summary",
        "job",
        "steps",
        "stragglers",
        "mfu",
        "recommendations",
        *EXTRA_KEYS,
    ]
    assert len(calls) == 1


def test_trace_windows_that_share_no_step_are_not_assessed():
    """Ranks whose trace windows do not overlap (a real 6-rank GPU job straddled its iteration
    roundup): no arrival was compared, so the verdict must not claim a clean job. One host, one
    clock (on two hosts a window 4 steps later is indistinguishable from a clock offset)."""
    traces = make_job(2, 8, skip_steps={0: {4, 5, 6, 7}, 1: {0, 1, 2, 3}}, hosts=["h", "h"])
    d = diagnose(traces)
    s = d.stragglers
    assert s.kind == "not_assessed" and s.ranks == [] and s.skew_fraction is None
    line = d.verdict_lines()[0]
    assert line.startswith("STRAGGLERS NOT ASSESSED: the ranks' trace windows share no step"), line
    assert d.summary()[0].startswith("NOT ASSESSED: the ranks' trace windows do not overlap")
    assert "NO STRAGGLER" not in " ".join(d.summary())
