"""Acceptance: the document of every backend equals the reference one, key by key, on real
multi-rank traces. The reference is built without the orchestration: every trace loaded whole
into this process, then ``run_analyses`` / ``run_diagnosis`` (the diagnosis over the full
traces) / ``build_document``. Exact equality: every number is computed by the same Polars
expressions over the same rows of one rank, and cross-rank sums run in the same order (no
float tolerance needed; a difference fails)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kinetoscope.analysis.runner import build_document, run_analyses
from kinetoscope.diagnosis.document import run_diagnosis
from kinetoscope.scale import analyze_files
from kinetoscope.trace import load_traces
from tests.scale.conftest import PAIR


def analyze_paths(
    files: list[Path], names: list[str] | None = None, options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The reference document (module docstring)."""
    traces = load_traces(files, cache=False)
    results = run_analyses(traces, names, options)
    return build_document(traces, results, diagnosis=run_diagnosis(traces, results))


def assert_same_document(single: dict[str, Any], scaled: dict[str, Any]) -> None:
    assert list(scaled) == list(single), "keys or key order differ"
    for key, value in single.items():
        assert scaled[key] == value, f"document key {key!r} differs"


ALL = None  # default analyses


@pytest.mark.parametrize(
    ("backend", "workers"), [("single", None), ("local", 1), ("local", 2), ("auto", None)]
)
def test_local_pair_128gpu_job(backend: str, workers: int | None) -> None:
    single = analyze_paths(PAIR)
    assert single["kernel_distribution"] and single["stragglers"]
    assert_same_document(single, analyze_files(PAIR, backend=backend, workers=workers).document)


def test_local_mixed_8_ranks_every_analysis(mixed8: list[Path]) -> None:
    """Every registered analysis (not only the defaults), ranks whose top kernels differ."""
    from kinetoscope.analysis import registry

    names = registry.names()
    single = analyze_paths(mixed8, names=names, options={"num_kernels": 3})
    scaled = analyze_files(mixed8, backend="local", workers=2, names=names, options={"num_kernels": 3})
    assert_same_document(single, scaled.document)


def test_local_control_8_ranks(control8: list[Path]) -> None:
    """The 8-rank set of benchmarks/bench_analyze.py --ranks 8 (copies of trace_diff/control)."""
    assert_same_document(
        analyze_paths(control8), analyze_files(control8, backend="local", workers=2).document
    )


def test_input_order_is_kept(mixed8: list[Path]) -> None:
    files = list(reversed(mixed8))
    single = analyze_paths(files)
    assert [t["rank"] for t in single["traces"]] == list(range(7, -1, -1))
    assert_same_document(single, analyze_files(files, backend="local", workers=2).document)


def test_a_bad_rank_file_is_an_error_entry(mixed8: list[Path], tmp_path: Path) -> None:
    bad = tmp_path / "rank-8.json.gz"
    bad.write_bytes(mixed8[0].read_bytes()[:5000])  # truncated gzip
    run = analyze_files([*mixed8[:3], bad, *mixed8[3:]], backend="local", workers=2)
    assert list(run.load_errors) == [str(bad)]
    assert str(bad) in run.document["errors"][str(bad)]
    single = analyze_paths(mixed8)
    doc = dict(run.document)
    assert doc.pop("errors") == {str(bad): run.load_errors[str(bad)]}
    single.pop("errors")
    assert_same_document(single, doc)


def test_ray_backend_equals_single_process(ray_session: Any, mixed8: list[Path]) -> None:
    assert ray_session.is_initialized()
    for files in (PAIR, mixed8):
        assert_same_document(analyze_paths(files), analyze_files(files, backend="ray").document)
    assert ray_session.is_initialized(), "a Ray the caller started is left running"


def test_ray_backend_control_8_ranks(ray_session: Any, control8: list[Path]) -> None:
    assert_same_document(analyze_paths(control8), analyze_files(control8, backend="ray").document)
