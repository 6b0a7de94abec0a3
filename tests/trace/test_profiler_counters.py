"""CUPTI profiler-range counters (``cuda_profiler_range`` complete events' ``args``) become
``counters`` rows: idx = the event's index, name = its name, key = the counter, value (Float64)."""

from __future__ import annotations

import polars as pl

from kinetoscope.trace import load_trace_reference, parse_trace
from tests.trace.conftest import assert_same_trace, write_doc
from tests.trace.corpus import TRACES_DIR

CUPTI = TRACES_DIR / "hta" / "cupti_profiler" / "benchmark_result_924719_1679055439_trace.json.gz"
FFMA = "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"


def test_cupti_trace_counters():
    t = parse_trace(CUPTI)
    ranges = t.events.filter(pl.col("kind") == "cuda_profiler_range")
    assert ranges.height == 77
    c = t.counters
    assert c.height == 77 * 9
    assert c["idx"].unique().sort().to_list() == ranges["idx"].sort().to_list()
    second = c.filter((pl.col("idx") == ranges["idx"][1]) & (pl.col("key") == FFMA))
    assert second["value"].to_list() == [9119334400.0]
    assert second["ts"].to_list() == [ranges["ts"][1]]
    assert second["name"].to_list() == ["__missing__"]
    assert_same_trace(t, load_trace_reference(CUPTI))


def test_only_numbers_and_in_file_order(tmp_path):
    events = [
        {"ph": "C", "name": "Queue", "pid": 0, "ts": 1, "args": {"len": 3}},
        {
            "ph": "X",
            "cat": "cuda_profiler_range",
            "name": "k",
            "pid": 0,
            "tid": 0,
            "ts": 2.5,
            "dur": 1,
            "args": {FFMA: 10, "flag": True, "label": "x", "list": [1], "f": 0.5, "big": 2**60},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "not a range",
            "pid": 0,
            "tid": 0,
            "ts": 3,
            "dur": 1,
            "args": {FFMA: 99},
        },
        {"ph": "C", "name": "Queue", "pid": 0, "ts": 4, "args": {"len": 4}},
    ]
    p = write_doc(tmp_path / "t.json", {"traceEvents": events})
    t = parse_trace(p)
    assert t.counters.select("idx", "name", "ts", "key", "value").rows() == [
        (0, "Queue", 1000, "len", 3.0),
        (1, "k", 2500, FFMA, 10.0),
        (1, "k", 2500, "flag", 1.0),
        (1, "k", 2500, "f", 0.5),
        (1, "k", 2500, "big", float(2**60)),
        (3, "Queue", 4000, "len", 4.0),
    ]
    assert_same_trace(t, load_trace_reference(p))
