"""Fixtures for the heavy analyses: cached real traces and a cached HTA oracle.

HTA (``traceinsight``, ``import hta``) is only a test oracle. Its calls are cached per session
and always given copies of the vendored traces (it may write beside them).
"""

from __future__ import annotations

import atexit
import functools
import importlib
import logging
import shutil
import tempfile
from pathlib import Path

import pytest

from kinetoscope.trace import Trace, load_trace

HTA_DIR = Path(__file__).resolve().parents[2] / "data" / "traces" / "hta"

CP_ANNOTATION = "[param|pytorch.model.alex_net|0|0|0|measure|forward]"
ALEXNET = "critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"
SIMPLE_ADD = "critical_path/end_to_end/simple_add/input/trace.json.gz"
SIMPLE_ADD_OVERLAY = "critical_path/end_to_end/simple_add/output/overlaid_critical_path_trace.json.gz"
EVENT_SYNC = "critical_path/cuda_event_sync/event_sync_trace.json.gz"
EVENT_SYNC_MULTI = "critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz"
NS_RESOLUTION = "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
CONTROL = "trace_diff/control/control.json.gz"
TEST = "trace_diff/test/test.json.gz"
COMPARE_BASE = "trace_compare/base/base.json.gz"
COMPARE_TEST = "trace_compare/test/test.json.gz"
CUPTI = "cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz"
MEMORY_RAW = "memory_analysis/memory_timeline.raw.gz"
DF_INDEX = "df_index_resolver/df_index_resolver.json.gz"

_SCRATCH = Path(tempfile.mkdtemp(prefix="kscope-heavy-"))
atexit.register(shutil.rmtree, _SCRATCH, True)


@functools.cache
def real(rel: str) -> Trace:
    """A vendored trace, loaded once per session (do not mutate it)."""
    return load_trace(str(HTA_DIR / rel))


def scratch_copy(rel: str) -> str:
    """Absolute path of a private copy of a vendored trace (HTA wants absolute paths)."""
    dst = _SCRATCH / rel.replace("/", "__")
    if not dst.exists():
        shutil.copyfile(HTA_DIR / rel, dst)
    return str(dst)


def hta_available() -> bool:
    try:
        importlib.import_module("hta")
    except Exception:
        return False
    return True


needs_hta = pytest.mark.skipif(not hta_available(), reason="HTA (traceinsight) is not installed")


@functools.cache
def hta_analysis(rel: str, rank: int):
    """A cached ``hta.trace_analysis.TraceAnalysis`` for one vendored trace."""
    logging.getLogger("hta").setLevel(logging.ERROR)
    from hta.trace_analysis import TraceAnalysis

    return TraceAnalysis(trace_files={rank: scratch_copy(rel)})


@functools.cache
def hta_critical_path(rel: str, annotation: str, instance, zero_weight_launch_edges: bool = True) -> dict:
    """HTA's critical path graph, reduced to plain data: nodes, edges, path, summary."""
    from hta.configs.env_options import HTAEnvOptions

    opts = HTAEnvOptions.instance()  # a singleton that read the environment once
    old = opts.critical_path_add_zero_weight_launch_edges()
    opts.set_critical_path_add_zero_weight_launch_edges(zero_weight_launch_edges)
    try:
        ta = hta_analysis(rel, 0)
        g, ok = ta.critical_path_analysis(rank=0, annotation=annotation, instance_id=instance)
        edges = {}
        for u, v in g.edges:
            e = g.edges[u, v]["object"]
            edges[(u, v)] = (e.type.value, int(g.edges[u, v]["weight"]), g.edge_to_event_map.get((u, v)))
        summary = {k: float(v) for k, v in g.summary().items()}
        return {
            "ok": ok,
            "node_list": [(int(n.ev_idx), bool(n.is_start)) for n in g.node_list],
            "num_graph_nodes": len(g.nodes),
            "edges": edges,
            "path": [int(n) for n in g.critical_path_nodes],
            "critical_events": sorted(int(e) for e in g.critical_path_events_set),
            "summary": summary,
        }
    finally:
        opts.set_critical_path_add_zero_weight_launch_edges(old)


def hta_like(trace: Trace) -> Trace:
    """The events HTA keeps at load time: with 2+ ProfilerSteps it drops host rows starting in
    the last step and every GPU row whose correlation no kept host row has (HTA issue #76)."""
    import dataclasses

    import polars as pl

    ev = trace.events
    steps = ev.filter(pl.col("name").str.starts_with("ProfilerStep#"))
    if steps["name"].n_unique() < 2:
        return trace
    last = steps["ts"].max()
    gpu_side = (
        pl.col("stream").is_not_null() & (pl.col("stream") >= 0) & pl.col("correlation").is_not_null()
    ) | pl.col("name").is_in(["Event Sync", "Context Sync"])
    host = ev.filter(~gpu_side & (pl.col("ts") < last))
    keep = host.filter(pl.col("correlation").is_not_null())["correlation"].implode()
    gpu = ev.filter(gpu_side & pl.col("correlation").is_in(keep))
    return dataclasses.replace(trace, events=pl.concat([host, gpu]).sort("idx"))


@functools.cache
def hta_frequent_sequences(rel: str, rank: int, operator_name: str) -> list[dict]:
    ta = hta_analysis(rel, rank)
    out = ta.get_frequent_cuda_kernel_sequences(operator_name, str(_SCRATCH), rank=rank, visualize=False)
    return out.to_dict(orient="records")
