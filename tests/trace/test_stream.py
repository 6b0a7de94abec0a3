"""The chunked splitter: boundaries inside strings/nested values, every layout Kineto and other
writers produce, tiny chunk and block sizes, metadata before and after the events."""

from __future__ import annotations

import gzip
import tracemalloc

import orjson
import pytest

from kinetoscope.trace import decode, load_trace, load_trace_reference, parse_trace
from tests.trace.conftest import assert_same_trace, write_doc

TRICKY = [
    {
        "ph": "X",
        "cat": "cpu_op",
        "name": "a }, { b",
        "pid": 1,
        "tid": 1,
        "ts": 1,
        "dur": 2,
        "args": {
            "Input Dims": [[1, 2], []],
            "Input type": ["float", "}, {"],
            "External id": 1,
            "nested": [{"x": 1}, {"y": {"z": [{}, {}]}}],
            "Concrete Inputs": ["", '{"a": 1}'],
        },
    },
    {
        "ph": "X",
        "cat": "kernel",
        "name": 'k"}, {\\',
        "pid": 0,
        "tid": 7,
        "ts": 2.5,
        "dur": 0.001,
        "args": {"stream": 7, "correlation": 9, "grid": [1, 2, 3], "block": [4, 1, 1], "blocks per SM": 0.5},
    },
    {"ph": "s", "id": 9, "pid": 1, "tid": 1, "ts": 1, "cat": "ac2g", "name": "ac2g"},
    {"ph": "f", "id": 9, "pid": 0, "tid": 7, "ts": 2.5, "cat": "ac2g", "name": "ac2g", "bp": "e"},
    {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
    {"ph": "M", "name": "process_sort_index", "pid": 0, "args": {"sort_index": 5}},
    {
        "ph": "i",
        "s": "t",
        "name": "[memory]",
        "pid": 1,
        "tid": 1,
        "ts": 3,
        "args": {
            "Device Type": 1,
            "Device Id": 0,
            "Addr": 140000000000,
            "Bytes": -512,
            "Total Allocated": 1024,
            "Total Reserved": 2048,
        },
    },
    {"ph": "C", "name": "Queue", "pid": 0, "ts": 4, "args": {"a": 1, "b": 2.5}},
    {"ph": "B", "name": "ignored", "pid": 0, "ts": 5},
    {"ph": "E", "pid": 0, "ts": 6},
    {
        "ph": "X",
        "cat": "user_annotation",
        "name": "ProfilerStep#3",
        "pid": "Spans",
        "tid": "PyTorch Profiler",
        "ts": 1,
        "dur": 100,
        "args": {},
    },
    {"name": "no phase", "pid": 3},
    {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 1,
        "tid": 1,
        "ts": 1.5,
        "dur": 1,
        "args": {"correlation": 9, "External id": 1, "cbid": 211},
    },
]
META_AFTER = {
    "traceName": "x }, { y",
    "log": ["}, {", {"a": [{"b": 1}, {"c": 2}]}],
    "baseTimeNanoseconds": 17,
}


def doc(n_repeat: int = 30, legacy: bool = False):
    events = []
    for r in range(n_repeat):
        for e in TRICKY:
            e = dict(e)
            if "ts" in e:
                e["ts"] = e["ts"] + r * 1000
            events.append(e)
    if legacy:
        return events
    return {
        "schemaVersion": 1,
        "distributedInfo": {"rank": 2, "world_size": 4},
        "traceEvents": events,
        **META_AFTER,
    }


@pytest.mark.parametrize("chunk", [1, 17, 100, 1000, 5000, None])
@pytest.mark.parametrize("block", [1, 33, 4096])
def test_tiny_chunks_and_blocks(tmp_path, chunk, block):
    p = write_doc(tmp_path / "t.json", doc())
    ref = load_trace_reference(p)
    assert_same_trace(parse_trace(p, chunk_bytes=chunk, block_bytes=block), ref)


@pytest.mark.parametrize(
    "fmt",
    ["indent", "compact", "crlf", "tabs", "bom", "gz", "legacy", "legacy-compact", "multi-member-gz"],
)
def test_layouts(tmp_path, fmt):
    legacy = fmt.startswith("legacy")
    d = doc(legacy=legacy)
    raw = orjson.dumps(d, option=0 if "compact" in fmt else orjson.OPT_INDENT_2)
    if fmt == "crlf":
        raw = raw.replace(b"\n", b"\r\n")
    elif fmt == "tabs":
        raw = raw.replace(b"  ", b"\t")
    elif fmt == "bom":
        raw = b"\xef\xbb\xbf" + raw
    name = "t.json"
    if fmt == "gz":
        raw, name = gzip.compress(raw), "t.json.gz"
    elif fmt == "multi-member-gz":
        raw, name = gzip.compress(raw[:1000]) + gzip.compress(raw[1000:]), "t.json.gz"
    p = write_doc(tmp_path / name, raw=raw)
    ref = load_trace_reference(p)
    for chunk in (None, 64):
        t = parse_trace(p, chunk_bytes=chunk, block_bytes=chunk)
        assert_same_trace(t, ref)
    if not legacy:
        assert t.meta.extra["traceName"] == META_AFTER["traceName"]
        assert t.meta.extra["log"] == META_AFTER["log"]
        assert t.meta.base_time_ns == 17 and t.meta.rank == 2 and t.meta.world_size == 4


def test_tables_content(tmp_path):
    p = write_doc(tmp_path / "t.json", doc(n_repeat=1))
    t = parse_trace(p)
    assert t.events["name"].to_list() == ["a }, { b", 'k"}, {\\', "ProfilerStep#3", "cudaLaunchKernel"]
    k = t.events.row(1, named=True)
    assert (k["ts"], k["dur"], k["stream"], k["grid"], k["blocks_per_sm"]) == (2500, 1, 7, "[1,2,3]", 0.5)
    cpu = t.events.row(0, named=True)
    assert cpu["input_dims"] == "[[1,2],[]]" and cpu["input_type"] == '["float","}, {"]'
    assert cpu["concrete_inputs"] == '["","{\\"a\\": 1}"]'
    assert t.events["kind"].to_list() == ["cpu_op", "kernel", "user_annotation", "cuda_runtime"]
    assert t.events["pid"].to_list()[2] == t.meta.labels["Spans"] == -1
    assert t.events["tid"].to_list()[2] == t.meta.labels["PyTorch Profiler"] == -2
    assert t.flows["ph"].to_list() == ["s", "f"] and t.flows["id"].to_list() == [9, 9]
    assert t.processes.rows() == [(0, "GPU 0", None, 5)]
    assert t.threads.rows() == [(1, 1, "main", None)]
    assert t.instants.row(0, named=True)["bytes"] == -512
    assert t.counters.select("key", "value").rows() == [("a", 1.0), ("b", 2.5)]
    links = t.launch_links()
    assert links.select("launch_name", "gpu_name").rows() == [("cudaLaunchKernel", 'k"}, {\\')]


def test_empty_events(tmp_path):
    for raw in (b'{"traceEvents": []}', b"[]", b'{"traceEvents": [  \n ], "x": 1}'):
        t = load_trace(write_doc(tmp_path / "t.json", raw=raw), cache=False)
        assert t.events.is_empty() and t.meta.num_trace_events == 0


def test_huge_metadata_value_is_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(decode, "META_VALUE_LIMIT", 1000)
    d = {"deviceProperties": [{"name": "x" * 50, "k": [1, {"z": "]}"}]}] * 200, **doc(n_repeat=2)}
    p = write_doc(tmp_path / "t.json", d)
    t = parse_trace(p, chunk_bytes=256, block_bytes=256)
    assert any("'deviceProperties'" in w and "skipped" in w for w in t.meta.warnings)
    assert t.meta.device_properties == []
    assert t.events.equals(load_trace_reference(p).events)


def test_odd_types_take_the_reference_path(tmp_path):
    events = [dict(e) for e in doc(n_repeat=3)["traceEvents"]]
    events[5]["pid"] = 2.0  # float pid: the typed decoder rejects it
    events[20]["ts"] = "123.25"  # numeric string
    events[30]["args"] = None
    events[31]["tid"] = True
    p = write_doc(tmp_path / "t.json", {"traceEvents": events})
    assert_same_trace(parse_trace(p, chunk_bytes=300), load_trace_reference(p))


def test_memory_is_bounded_by_the_chunk(tmp_path):
    """Python-level peak memory depends on the chunk size, not on the file size."""

    def peak_for(n_repeat: int) -> tuple[int, int]:
        events = [dict(e) for e in doc(n_repeat=n_repeat)["traceEvents"]]
        p = write_doc(tmp_path / f"t{n_repeat}.json", {"traceEvents": events})
        del events
        tracemalloc.start()
        try:
            parse_trace(p, chunk_bytes=64 << 10, block_bytes=64 << 10)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        return peak, p.stat().st_size

    small, small_size = peak_for(400)
    big, big_size = peak_for(1600)
    assert big_size > 3 * small_size
    assert big < small * 1.25 + (256 << 10), (small, big)
    assert big < big_size / 2
