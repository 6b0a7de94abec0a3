"""A map task loads only what its analyses and the diagnosis read (``AnalysisSpec.reads``,
``diagnosis.extract.READS``; ``kinetoscope.trace.compact``): every result must be the same as on
the whole trace. Real traces of every kind in the test data (GPU, AMD, MTIA, CPU-only, NCCL,
user annotations, CUPTI counters, Triton), so that a column an analysis reads but does not
declare fails here (a missing column raises; a dropped table has no columns)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from kinetoscope.analysis import registry
from kinetoscope.scale import AnalyzeRequest, analyze_files
from kinetoscope.scale.mapper import RankTask, task_reads
from kinetoscope.trace import Trace, load_trace, parse_trace
from kinetoscope.trace.compact import kept_columns, project
from tests.conftest import HTA_TRACES as HTA
from tests.scale.test_equivalence import analyze_paths, assert_same_document

KINDS = [
    "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "cpu_only_v2024_full/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "with_gpu_user_annotation/step_based_trace_2543932.json.gz",
    "critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
    "cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz",
    "mtia_inference_trace/mtia_inference_rank_0.json.gz",
    "nccl_parser_config/nccl_data.json.gz",
    "triton_example/triton_example.json.gz",
    "timeline_analysis/sampled_rank-0.json.gz",
]
PATHS = [HTA / k for k in KINDS]


def _projected(full: Trace, reads: dict[str, set[str]] | dict[str, tuple[str, ...]]) -> Trace:
    """A copy of ``full`` (no memos) with only ``reads`` kept."""
    return project(dataclasses.replace(full), reads)


@pytest.mark.parametrize("path", PATHS, ids=[k.split("/")[0] for k in KINDS])
def test_default_document_is_the_same_with_projection(path: Path) -> None:
    """The whole default document (analyses + diagnosis) of the map path, which projects,
    equals the reference built over the whole trace."""
    task = RankTask(0, str(path), tuple(registry.default_names()), AnalyzeRequest(cache=False))
    assert task_reads(task) is not None  # the default document is projected
    scaled = analyze_files([path], backend="single", cache=False).document
    assert not scaled.get("errors")
    assert_same_document(analyze_paths([path]), scaled)


@pytest.mark.parametrize("path", PATHS, ids=[k.split("/")[0] for k in KINDS])
def test_every_declared_analysis_is_the_same_on_its_reads(path: Path) -> None:
    """Each analysis that declares ``reads`` (default or not), alone on a trace with only
    those tables and columns, gives the result it gives on the whole trace."""
    full = load_trace(path, cache=False)
    declared = [s for s in registry.all_specs() if s.reads is not None]
    assert {s.name for s in declared} >= set(registry.default_names())
    for spec in declared:
        want = spec.call([dataclasses.replace(full)])
        got = spec.call([_projected(full, dict(spec.reads or {}))])
        try:
            assert_frame_equal(got, want, check_exact=True)
        except AssertionError as exc:
            raise AssertionError(f"{spec.name}: {exc}") from None


def test_task_reads_falls_back_to_everything() -> None:
    req = AnalyzeRequest(cache=False)
    undeclared = [s.name for s in registry.all_specs() if s.reads is None]
    assert undeclared, "some analysis does not declare its reads (a driver or a heavier one)"
    assert task_reads(RankTask(0, "x", (undeclared[0],), req)) is None
    assert task_reads(RankTask(0, "x", ("temporal_breakdown",), req, project=False)) is None
    reads = task_reads(RankTask(0, "x", ("temporal_breakdown",), req))
    assert reads is not None and set(reads) == {"events"}
    assert {"input_dims", "flops"} <= reads["events"]  # the diagnosis's reads are added
    no_diag = task_reads(
        RankTask(0, "x", ("temporal_breakdown",), AnalyzeRequest(cache=False, diagnosis=False))
    )
    assert no_diag is not None and "flops" not in no_diag["events"]


@pytest.mark.parametrize("cache", [False, True])
def test_load_with_columns_keeps_exactly_those(tmp_path: Path, cache: bool) -> None:
    """Parsed in many chunks (dropped chunk by chunk) or through the cache (whole, then
    projected): the kept columns equal the whole trace's; a dropped table has no columns."""
    path = HTA / "timeline_analysis" / "sampled_rank-0.json.gz"
    full = load_trace(path, cache=False)
    cols = {"events": ("ts", "stream"), "instants": ("name",)}
    if cache:
        got = load_trace(path, cache=True, cache_dir=tmp_path, columns=cols)
        again = load_trace(path, cache=True, cache_dir=tmp_path, columns=cols)  # a cache hit
        assert_frame_equal(again.events, got.events)
    else:
        got = parse_trace(path, chunk_bytes=16_384, workers=0, columns=cols)
    keep = kept_columns("events", cols)
    assert keep == ["idx", "kind", "name", "ts", "dur", "stream"]  # + what the loader reads
    assert_frame_equal(got.events, full.events.select(keep))
    assert_frame_equal(got.instants, full.instants.select("name"))
    assert got.flows.width == 0 and got.counters.width == 0
    with pytest.raises(pl.exceptions.ColumnNotFoundError):
        got.flows.select("ts")
    assert_frame_equal(got.processes, full.processes)
    assert_frame_equal(got.threads, full.threads)
    assert got.meta.num_trace_events == full.meta.num_trace_events
    assert got.meta.device_type == full.meta.device_type


def test_an_unknown_column_is_refused() -> None:
    with pytest.raises(ValueError, match="no column"):
        kept_columns("events", {"events": ("nope",)})
