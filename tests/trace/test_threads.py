"""Chunks decoded by threads (kinetoscope.trace.threads) give exactly the serial result: the
same tables, metadata, labels and warnings, and for bad input the same error, whatever the
chunk size and wherever boundaries fall (the cases of test_parallel.py, with threads)."""

from __future__ import annotations

import gzip
import threading

import orjson
import pytest

from kinetoscope.trace import _native, load_trace_reference, loader, parse_trace, threads
from tests.trace.conftest import assert_same_as_serial, assert_same_trace, parse_both, write_doc
from tests.trace.corpus import TRACES_DIR
from tests.trace.test_parallel import big_doc
from tests.trace.test_stream import doc

pytestmark = pytest.mark.skipif(not _native.enabled(), reason="threads decode with the native decoder only")


@pytest.fixture(autouse=True)
def threads_for_every_file(monkeypatch):
    """Threads for any file size here (two of them, whatever the CPU count)."""
    monkeypatch.setattr(loader, "THREAD_FILE_MIN_BYTES", 0)
    monkeypatch.setenv("KSCOPE_LOAD_THREADS", "2")
    monkeypatch.setattr(loader.os, "cpu_count", lambda: 2)


def both(p, **kw):
    """(threads, serial) results of parse_trace; TraceErrors are returned, not raised."""
    return parse_both(p, None, **kw)


def assert_same(p, **kw):
    return assert_same_as_serial(p, None, **kw)


@pytest.mark.parametrize("chunk", [64, 300, 4096, 50_000, None])
def test_tricky_documents(tmp_path, chunk):
    for legacy in (False, True):
        p = write_doc(tmp_path / f"t{legacy}.json", doc(legacy=legacy))
        ser = assert_same(p, chunk_bytes=chunk)
        assert_same_trace(ser, load_trace_reference(p))


@pytest.mark.parametrize("chunk", [2000, 30_000, 200_000])
@pytest.mark.parametrize("indent", [True, False])
def test_many_chunks(tmp_path, chunk, indent):
    p = write_doc(tmp_path / "t.json.gz", big_doc(), gz=True, indent=indent)
    before = dict(threads.STATS)
    ser = assert_same(p, chunk_bytes=chunk)
    # the threads took chunks (the decoder gives many of these odd ones back to the serial path)
    assert sum(threads.STATS.values()) > sum(before.values())
    assert ser.meta.labels  # string pids were numbered across chunks
    assert_same_trace(ser, load_trace_reference(p))


@pytest.mark.parametrize(
    "rel",
    [
        "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",  # exact epoch ts
        "hta/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz",  # profiler counters
        "hta/mtia_inference_trace/mtia_inference_rank_0.json.gz",
        "hta/trace_diff/control/control.json.gz",
        "hta/df_index_resolver/df_index_resolver.json.gz",  # the 54 MB trace, default chunks
    ],
)
def test_corpus_files(rel):
    before = threads.STATS["built"]
    assert_same(TRACES_DIR / rel, chunk_bytes=1 << 18)
    assert_same(TRACES_DIR / rel)
    assert threads.STATS["built"] > before  # the threads did decode chunks


@pytest.mark.parametrize("where", [0.1, 0.5, 0.93])
@pytest.mark.parametrize(
    "damage", ["syntax", "trailing-comma", "truncated", "no-name", "bad-ts", "gz-truncated"]
)
def test_errors_are_the_serial_errors(tmp_path, where, damage):
    d = big_doc(2000, seed=1)
    evs = d["traceEvents"]
    k = int(len(evs) * where)
    if damage == "no-name":
        evs[k] = {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 1, "dur": 1}
    elif damage == "bad-ts":
        evs[k] = {"ph": "X", "cat": "cpu_op", "name": "x", "pid": 1, "tid": 1, "ts": "soon", "dur": 1}
    raw = orjson.dumps(d, option=orjson.OPT_INDENT_2)
    cut = int(len(raw) * where)
    if damage == "trailing-comma":
        i = raw.index(b"}", cut)
        raw = raw[: i + 1] + b",]" + raw[i + 1 :]
    elif damage == "syntax":
        raw = raw[:cut] + b"}}" + raw[cut:]
    elif damage == "truncated":
        raw = raw[:cut]
    if damage == "gz-truncated":
        z = gzip.compress(raw, 1)
        p = write_doc(tmp_path / "t.json.gz", raw=z[: int(len(z) * where)])
    else:
        p = write_doc(tmp_path / "t.json", raw=raw)
    for chunk in (3000, 40_000):
        assert_same(p, chunk_bytes=chunk)


def test_columns_are_dropped_the_same_way():
    path = TRACES_DIR / "hta/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz"
    cols = {"events": ("ts", "correlation", "input_dims"), "counters": ("value",)}
    thr, ser = both(path, chunk_bytes=1 << 15, columns=cols)
    assert_same_trace(thr, ser)
    assert thr.events.columns == ["idx", "kind", "name", "ts", "dur", "correlation", "input_dims"]


def test_two_parses_at_once_share_nothing(tmp_path):
    """A second parse while the threads are busy runs serially, with the same result."""
    p = write_doc(tmp_path / "t.json.gz", big_doc(3000, seed=3), gz=True)
    want = parse_trace(p, workers=0, chunk_bytes=5000)
    got: list[object] = []
    ts = [threading.Thread(target=lambda: got.append(parse_trace(p, chunk_bytes=5000))) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert len(got) == 3
    for g in got:
        assert_same_trace(g, want)


@pytest.mark.parametrize("setting", [None, "0"])
def test_off_by_default_and_with_zero(tmp_path, monkeypatch, setting):
    if setting is None:
        monkeypatch.delenv("KSCOPE_LOAD_THREADS")
    else:
        monkeypatch.setenv("KSCOPE_LOAD_THREADS", setting)
    assert threads.get_pool() is None
    p = write_doc(tmp_path / "t.json", big_doc(500))
    before = dict(threads.STATS)
    parse_trace(p, chunk_bytes=3000)
    assert threads.STATS == before
