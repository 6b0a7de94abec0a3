"""run_analyses / build_document / registry, and `kscope analyze` end to end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from hta_parity_support import HTA_DIR, ours
from typer.testing import CliRunner

from kinetoscope.analysis import AnalysisResults, build_document, registry, run_analyses
from kinetoscope.analysis.registry import AnalysisSpec
from kinetoscope.analysis.runner import NO_GPU_NOTE
from kinetoscope.cli.main import app

REPO = Path(__file__).resolve().parents[2]
CONTROL = "trace_diff/control/control.json.gz"
CPU_ONLY = "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"

# The analyses of this package's core modules (other modules register more).
CORE_MODULES = {
    "kinetoscope.analysis.steps",
    "kinetoscope.analysis.temporal",
    "kinetoscope.analysis.idle_time",
    "kinetoscope.analysis.kernel_breakdown",
    "kinetoscope.analysis.kernel_distribution",
    "kinetoscope.analysis.comm_overlap",
    "kinetoscope.analysis.user_annotation",
    "kinetoscope.analysis.launch_stats",
    "kinetoscope.analysis.counters",
}


def core_names() -> list[str]:
    return [s.name for s in registry.all_specs() if s.func.__module__ in CORE_MODULES]


HTA_COLUMNS = {
    "temporal_breakdown": {
        "rank",
        "idle_time(us)",
        "compute_time(us)",
        "non_compute_time(us)",
        "kernel_time(us)",
        "idle_time_pctg",
        "compute_time_pctg",
        "non_compute_time_pctg",
    },
    "idle_time_breakdown": {"rank", "stream", "idle_category", "idle_time", "idle_time_ratio"},
    "kernel_type_breakdown": {"rank", "kernel_type", "sum", "percentage"},
    "kernel_breakdown": {
        "rank",
        "kernel_type",
        "name",
        "sum (us)",
        "max (us)",
        "min (us)",
        "stddev",
        "mean (us)",
    },
    "comm_comp_overlap": {"rank", "comp_comm_overlap_pctg"},
}


def _kscope(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "kinetoscope.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=timeout,
    )


def test_registry_names_and_specs():
    names = registry.names()
    assert len(names) == len(set(names))
    for key in (
        "temporal_breakdown",
        "idle_time_breakdown",
        "kernel_breakdown",
        "kernel_type_breakdown",
        "comm_comp_overlap",
        "kernel_distribution",
        "gpu_user_annotation_breakdown",
        "kernel_launch_summary",
        "queue_length_summary",
        "time_blocked_on_full_queue",
        "memory_bw_summary",
        "step_durations",
        "temporal_breakdown_by_step",
    ):
        assert key in registry.default_names(), key
    for key in (
        "idle_time_interval_stats",
        "kernel_launch_stats",
        "queue_length_time_series",
        "memory_bw_time_series",
        "gpu_kernels_with_user_annotations",
    ):
        assert key in names and key not in registry.default_names(), key
    with pytest.raises(KeyError, match="unknown analysis"):
        registry.get("no_such_analysis")


@pytest.fixture(scope="module")
def control_results():
    t = ours(CONTROL)
    return t, run_analyses([t], core_names(), raise_errors=True)


def test_every_analysis_runs_and_has_a_rank_column(control_results):
    t, res = control_results
    assert list(res) == core_names() and len(res) == 18
    assert not res.errors
    for name, df in res.items():
        assert isinstance(df, pl.DataFrame)
        assert "rank" in df.columns, name
        if not df.is_empty():
            assert set(df["rank"].unique()) == {3}, name
    for name, cols in HTA_COLUMNS.items():
        assert cols <= set(res[name].columns), name


def test_document_shape(control_results):
    t, res = control_results
    doc = build_document([t], res)
    assert list(doc)[0] == "traces"
    assert doc["traces"][0]["rank"] == 3 and doc["traces"][0]["device_type"] == "NVIDIA GPU"
    for name in res:
        assert isinstance(doc[name], list)
    assert doc["notes"] == {
        "gpu_user_annotation_breakdown": "no gpu_user_annotation events",
        "gpu_kernels_with_user_annotations": "no gpu_user_annotation events",
    }
    json.dumps(doc, allow_nan=False)  # strictly valid JSON: NaN/inf became null


def test_options_reach_the_analysis(control_results):
    t, _ = control_results
    res = run_analyses(
        [t], ["kernel_breakdown", "idle_time_breakdown"], {"num_kernels": 2, "consecutive_kernel_delay_us": 0}
    )
    kb = res["kernel_breakdown"].filter(pl.col("kernel_type") == "COMPUTATION")
    assert kb.height == 3 and kb["name"].to_list()[-1] == "others"
    idle = res["idle_time_breakdown"]
    assert idle.filter(pl.col("idle_category") == "kernel_wait")["idle_time"].sum() == 0


def test_cpu_only_trace_says_no_gpu_events():
    t = ours(CPU_ONLY)
    res = run_analyses([t])
    gpu_names = [s.name for s in registry.all_specs() if s.default and s.needs_gpu and s.name in core_names()]
    for n in gpu_names:
        assert res.notes[n] == NO_GPU_NOTE and res[n].is_empty()
    assert not res.errors
    assert res["step_durations"].height == 1  # it has one ProfilerStep


def test_failing_analysis_is_reported_not_raised(control_results):
    t, _ = control_results

    def boom(traces):
        raise RuntimeError("kaput")

    registry.register(
        AnalysisSpec(name="zz_boom", func=boom, description="test", default=False, needs_gpu=False)
    )
    try:
        res = run_analyses([t], ["zz_boom", "temporal_breakdown"])
        assert res.errors == {"zz_boom": "RuntimeError: kaput"}
        assert res["temporal_breakdown"].height == 1
        with pytest.raises(RuntimeError):
            run_analyses([t], ["zz_boom"], raise_errors=True)
    finally:
        registry._REGISTRY.pop("zz_boom", None)


def test_diagnosis_hook(monkeypatch, control_results):
    import kinetoscope.diagnosis as diag

    t, _ = control_results

    def fake(traces, results, **options):
        assert isinstance(results, AnalysisResults)
        return {
            "summary": ["ALL GOOD: nothing to see"],
            "job": {"ranks": len(traces)},
            "stragglers": pl.DataFrame({"rank": [3], "score": [0.0]}),
        }

    monkeypatch.setattr(diag, "diagnose", fake, raising=False)
    from kinetoscope.analysis.runner import build_document, run_analyses
    from kinetoscope.diagnosis.document import run_diagnosis

    results = run_analyses([t], ["temporal_breakdown"])
    doc = build_document([t], results, diagnosis=run_diagnosis([t], results))
    assert doc["diagnosis_summary"] == ["ALL GOOD: nothing to see"]
    assert doc["job"] == {"ranks": 1} and doc["stragglers"] == [{"rank": 3, "score": 0.0}]
    keys = list(doc)
    assert keys.index("job") < keys.index("temporal_breakdown")

    out = CliRunner().invoke(
        app,
        ["analyze", str(t.path), "--only", "temporal_breakdown", "--only", "stragglers"],
        terminal_width=200,
    )
    assert out.exit_code == 0, out.output
    assert out.output.index("ALL GOOD") < out.output.index("temporal_breakdown")


# ---- the real command line -------------------------------------------------------------------


def test_cli_json_on_control():
    p = _kscope("analyze", str(HTA_DIR / CONTROL), "--json", "--no-cache")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    for key in ("traces", *HTA_COLUMNS, "notes", "errors"):
        assert key in doc, key
    for name, cols in HTA_COLUMNS.items():
        assert cols <= set(doc[name][0]), name
    tb = doc["temporal_breakdown"][0]
    assert tb["rank"] == 3 and tb["kernel_time(us)"] == 464594.0
    assert {r["idle_category"] for r in doc["idle_time_breakdown"]} == {"host_wait", "kernel_wait", "other"}


def test_cli_tables_on_control_and_only():
    p = _kscope(
        "analyze",
        str(HTA_DIR / CONTROL),
        "--no-cache",
        "--only",
        "temporal_breakdown",
        "--only",
        "comm_comp_overlap",
    )
    assert p.returncode == 0, p.stderr
    assert "temporal_breakdown" in p.stdout and "comm_comp_overlap" in p.stdout
    assert "idle_time_breakdown" not in p.stdout
    assert "46.24" in p.stdout


def test_cli_cpu_only_and_directory_of_two_ranks(tmp_path):
    p = _kscope("analyze", str(HTA_DIR / CPU_ONLY), "--no-cache", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["temporal_breakdown"] == [] and doc["notes"]["temporal_breakdown"] == NO_GPU_NOTE

    shutil.copyfile(HTA_DIR / "timeline_analysis/sampled_rank-0.json.gz", tmp_path / "rank0.json.gz")
    shutil.copyfile(HTA_DIR / "trace_filter/sampled_rank-1.json.gz", tmp_path / "rank1.json.gz")
    p = _kscope("analyze", str(tmp_path), "--no-cache", "--json", "--only", "comm_comp_overlap")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert [r["rank"] for r in doc["comm_comp_overlap"]] == [0, 1]
    p = _kscope(
        "analyze", str(tmp_path), "--no-cache", "--json", "--only", "comm_comp_overlap", "--ranks", "1"
    )
    assert [r["rank"] for r in json.loads(p.stdout)["comm_comp_overlap"]] == [1]


def test_cli_bad_input_is_one_message_and_nonzero(tmp_path):
    bad = tmp_path / "et.json.gz"
    shutil.copyfile(HTA_DIR / "execution_trace/benchmark_simple_add_et.json.gz", bad)
    for args in ([str(bad)], [str(tmp_path / "missing.json")]):
        p = _kscope("analyze", *args, "--no-cache")
        assert p.returncode != 0
        assert "Traceback" not in p.stderr and "Traceback" not in p.stdout
        assert "error" in p.stderr.lower()
    trunc = tmp_path / "trunc.json"
    trunc.write_text(
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "cat": "cpu_op"}, {"ph": "X", "na'
    )
    p = _kscope("analyze", str(trunc), "--no-cache")
    assert p.returncode != 0 and "Traceback" not in p.stderr


def test_cli_usage_errors():
    p = _kscope(
        "analyze", str(HTA_DIR / "trace_file_list/inference_rank_1.json.gz"), "--no-cache", "--only", "nope"
    )
    assert p.returncode == 2 and "unknown analysis 'nope'" in p.stderr and "Traceback" not in p.stderr
    p = _kscope(
        "analyze", str(HTA_DIR / "trace_file_list/inference_rank_1.json.gz"), "--no-cache", "--ranks", "5"
    )
    assert p.returncode == 2 and "loaded ranks: 1" in p.stderr
    p = _kscope("analyze", "--list")
    assert p.returncode == 0 and "temporal_breakdown" in p.stdout


def test_cli_only_selects_the_diagnosis_keys_added_later():
    """``--only`` accepts the diagnosis keys added after the first contract (pipeline,
    uneven_inputs, recompilation): the document holds just those (null for a job without the
    problem), and no analysis table."""
    p = _kscope(
        "analyze",
        str(HTA_DIR / CONTROL),
        "--no-cache",
        "--json",
        "--only",
        "pipeline",
        "--only",
        "recompilation",
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert "pipeline" in doc and "recompilation" in doc and doc["pipeline"] is None
    assert "uneven_inputs" not in doc and "stragglers" not in doc and "temporal_breakdown" not in doc
