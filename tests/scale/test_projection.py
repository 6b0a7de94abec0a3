"""A map task loads only what its analyses and the diagnosis read (``AnalysisSpec.reads``,
``diagnosis.extract.READS``; ``kinetoscope.trace.compact``): every result must be the same as on
the whole trace. Real traces of every kind in the test data (GPU, AMD, MTIA, CPU-only, NCCL,
user annotations, CUPTI counters, Triton, memory events), so that a column an analysis reads but does not
declare fails here (a missing column raises; a dropped table has no columns)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from kinetoscope.analysis import registry
from kinetoscope.analysis.reads import CORE_READS
from kinetoscope.analysis.runner import build_document, run_analyses
from kinetoscope.scale import AnalyzeRequest, analyze_files
from kinetoscope.scale.mapper import RankTask, task_reads
from kinetoscope.trace import Trace, load_trace, load_traces, parse_trace
from kinetoscope.trace.compact import LOADER_COLUMNS, kept_columns, project
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
    "df_index_resolver/df_index_resolver.json.gz",  # [memory] events (profile_memory=True)
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


# Options that take other paths through an analysis than its defaults (a step window, the
# innermost ops): checked on the declared reads too.
OTHER_OPTIONS = {
    "critical_path": {"annotation": "ProfilerStep", "add_zero_weight_launch_edges": True},
    "critical_path_breakdown": {"annotation": "ProfilerStep", "add_zero_weight_launch_edges": True},
    "frequent_kernel_sequences": {"outermost": False, "min_pattern_len": 1},
    "memory_allocation_sites": {"top_k": 2},
}


@pytest.mark.parametrize("path", PATHS, ids=[k.split("/")[0] for k in KINDS])
def test_analyses_with_other_options_are_the_same_on_their_reads(path: Path) -> None:
    full = load_trace(path, cache=False)
    for name, options in OTHER_OPTIONS.items():
        spec = registry.get(name)
        try:
            want = spec.call([dataclasses.replace(full)], options)
        except Exception as exc:  # noqa: BLE001 - e.g. no such annotation: the same error, then
            with pytest.raises(type(exc), match=re.escape(str(exc))):
                spec.call([_projected(full, dict(spec.reads or {}))], options)
            continue
        got = spec.call([_projected(full, dict(spec.reads or {}))], options)
        try:
            assert_frame_equal(got, want, check_exact=True)
        except AssertionError as exc:
            raise AssertionError(f"{name} {options}: {exc}") from None


def test_every_analysis_declares_its_reads() -> None:
    """So running every analysis (``--only`` each) loads only what its analyses read, not every column (each
    declaration is checked above: a column read but not declared fails there)."""
    undeclared = [s.name for s in registry.all_specs() if s.reads is None]
    assert undeclared == [], f"declare AnalysisSpec.reads (kinetoscope/analysis/reads.py) for {undeclared}"
    every = RankTask(0, "x", tuple(registry.names()), AnalyzeRequest(cache=False))
    reads = task_reads(every)
    assert reads is not None and set(reads) == {"events", "instants", "counters"}  # no flows


def test_a_heavy_analysis_alone_is_the_same_through_the_map() -> None:
    """An analysis whose reads do not include the device columns (``memory_summary``), without
    the diagnosis: the map still loads what its own GPU check reads."""
    path = HTA / "df_index_resolver" / "df_index_resolver.json.gz"
    names = ["memory_summary"]
    reads = task_reads(RankTask(0, str(path), tuple(names), AnalyzeRequest(cache=False, diagnosis=False)))
    assert reads is not None and {"stream", "kind"} <= reads["events"]
    run = analyze_files([path], backend="single", cache=False, names=names, diagnosis=False)
    traces = load_traces([path], cache=False)
    want = build_document(traces, run_analyses(traces, names))
    assert not run.document.get("errors") and run.document["memory_summary"]
    assert_same_document(want, run.document)


def test_task_reads_falls_back_to_everything(undeclared_analysis: str) -> None:
    req = AnalyzeRequest(cache=False)
    assert task_reads(RankTask(0, "x", (undeclared_analysis,), req)) is None
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


def _same_without(spec: registry.AnalysisSpec, fulls: list[Trace], reads: dict[str, tuple[str, ...]]) -> bool:
    """Whether ``spec`` gives the whole trace's result on every trace with only ``reads``."""
    for full in fulls:
        try:
            got = spec.call([_projected(full, reads)])
            assert_frame_equal(got, spec.call([dataclasses.replace(full)]), check_exact=True)
        except Exception:  # noqa: BLE001 - a missing column raises: the column is needed
            return False
    return True


def test_the_heavy_analyses_declare_no_column_they_do_not_need() -> None:
    """Exact declarations: for each analysis with its own reads (not the core analyses' shared
    set), dropping any one declared column changes a result or fails on some trace here."""
    fulls = [load_trace(p, cache=False) for p in PATHS]
    for spec in registry.all_specs():
        if spec.reads is None or spec.reads == CORE_READS:
            continue
        reads = {t: tuple(c) for t, c in spec.reads.items()}
        for table, cols in reads.items():
            for col in cols:
                if table == "events" and col in LOADER_COLUMNS:
                    continue  # always kept by the loader
                fewer = {**reads, table: tuple(c for c in cols if c != col)}
                assert not _same_without(spec, fulls, fewer), f"{spec.name}: {table}.{col} is not needed"
