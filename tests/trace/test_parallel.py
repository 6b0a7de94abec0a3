"""Parsing with worker processes (kinetoscope.trace.parallel) gives exactly the serial result:
the same tables, metadata, labels and warnings, and for bad input the same error (problem,
byte offset, event index), whatever the chunk size and wherever boundaries fall."""

from __future__ import annotations

import gzip
import random

import orjson
import pytest

from kinetoscope.trace import load_trace_reference, parallel, parse_trace
from tests.trace.conftest import assert_same_as_serial, assert_same_trace, parse_both, write_doc
from tests.trace.corpus import TRACES_DIR
from tests.trace.test_stream import META_AFTER, doc

W = 2


@pytest.fixture(scope="module", autouse=True)
def pool():
    p = parallel.get_pool(W)
    assert p is not None
    assert p.wait_ready(120), "worker processes did not start"
    parallel.release_pool(p)
    yield
    parallel.shutdown()


def both(p, **kw):
    """(parallel, serial) results of parse_trace; TraceErrors are returned, not raised."""
    return parse_both(p, W, **kw)


def assert_same(p, **kw):
    return assert_same_as_serial(p, W, **kw)


def big_doc(n=4000, seed=0):
    """Many events: string pids appearing late, strings and args that contain '}, {', flows,
    instants, counters, metadata; metadata after the array with '}, {' too."""
    rnd = random.Random(seed)
    events = []
    for i in range(n):
        r = rnd.random()
        pid = rnd.choice([1, 2, "Spans", f"label{i // 500}", "12"])
        if r < 0.6:
            args = {"External id": i, "Input Dims": [[1, 2], []], "Input type": ["float", "}, {"]}
            if rnd.random() < 0.1:
                args["nested"] = [{"x": 1}, {"y": [{}, {}]}]
            events.append(
                {
                    "ph": "X",
                    "cat": rnd.choice(["cpu_op", "kernel", "cuda_runtime"]),
                    "name": rnd.choice(["aten::mm", "k }, { x", 'q"}, {\\']),
                    "pid": pid,
                    "tid": i % 7,
                    "ts": 1000 + i,
                    "dur": rnd.choice([1, 2.5, 0.001]),
                    "args": args,
                }
            )
        elif r < 0.75:
            events.append(
                {
                    "ph": rnd.choice("sf"),
                    "id": i,
                    "pid": pid,
                    "tid": 1,
                    "ts": 1000 + i,
                    "cat": "ac2g",
                    "name": "ac2g",
                }
            )
        elif r < 0.85:
            events.append(
                {
                    "ph": "i",
                    "s": "t",
                    "name": "[memory]",
                    "pid": pid,
                    "tid": 1,
                    "ts": 1000 + i,
                    "args": {"Bytes": i, "Addr": 7},
                }
            )
        elif r < 0.9:
            events.append({"ph": "C", "name": "q", "pid": pid, "ts": 1000 + i, "args": {"v": i}})
        else:
            events.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": i % 7, "args": {"name": f"t{i}"}}
            )
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0}, {"id": 1}],
        "traceEvents": events,
        **META_AFTER,
    }


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
    before = dict(parallel.STATS)
    ser = assert_same(p, chunk_bytes=chunk)
    assert parallel.STATS["built"] > before.get("built", 0)  # the workers did build chunks
    if indent:  # pretty-printed: every cut is a real boundary (the separator heuristic), and the
        # last chunk, with the array's end and the metadata after it, is a worker's too
        assert parallel.STATS["failed"] == before.get("failed", 0)
    assert ser.meta.labels  # string pids were numbered across chunks
    assert_same_trace(ser, load_trace_reference(p))


@pytest.mark.parametrize(
    "rel",
    [
        "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",  # exact epoch ts
        "hta/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz",  # profiler counters
        "hta/mtia_inference_trace/mtia_inference_rank_0.json.gz",
        "hta/trace_diff/control/control.json.gz",
    ],
)
def test_corpus_files(rel):
    assert_same(TRACES_DIR / rel, chunk_bytes=1 << 18)


@pytest.mark.parametrize("where", [0.1, 0.5, 0.93])
@pytest.mark.parametrize(
    "damage",
    [
        ("syntax", lambda raw, k: raw[:k] + b"}}" + raw[k:]),
        ("trailing-comma", None),
        ("truncated", lambda raw, k: raw[:k]),
        ("no-name", None),
        ("bad-ts", None),
        ("gz-truncated", None),
    ],
    ids=lambda d: d[0],
)
def test_errors_are_the_serial_errors(tmp_path, where, damage):
    name, fn = damage
    d = big_doc(2000, seed=1)
    evs = d["traceEvents"]
    k = int(len(evs) * where)
    if name == "no-name":
        evs[k] = {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 1, "dur": 1}
    elif name == "bad-ts":
        evs[k] = {"ph": "X", "cat": "cpu_op", "name": "x", "pid": 1, "tid": 1, "ts": "soon", "dur": 1}
    raw = orjson.dumps(d, option=orjson.OPT_INDENT_2)
    cut = int(len(raw) * where)
    if name == "trailing-comma":
        i = raw.index(b"}", cut)
        raw = raw[: i + 1] + b",]" + raw[i + 1 :]
    elif fn is not None:
        raw = fn(raw, cut)
    if name == "gz-truncated":
        z = gzip.compress(raw, 1)
        p = write_doc(tmp_path / "t.json.gz", raw=z[: int(len(z) * where)])
    else:
        p = write_doc(tmp_path / "t.json", raw=raw)
    for chunk in (3000, 40_000):
        assert_same(p, chunk_bytes=chunk)


def test_exact_epoch_timestamps(tmp_path):
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": "TS", "dur": 1.5}
        for _ in range(3000)
    ]
    raw = orjson.dumps({"traceEvents": events}, option=orjson.OPT_INDENT_2)
    rnd = random.Random(5)
    parts = raw.split(b'"TS"')
    texts = [f"1712171498{i:06d}.{rnd.randint(0, 999):03d}" for i in range(len(parts) - 1)]
    raw = parts[0] + b"".join(t.encode() + p for t, p in zip(texts, parts[1:]))
    p = write_doc(tmp_path / "t.json", raw=raw)
    ser = assert_same(p, chunk_bytes=20_000)
    assert ser.events["ts"].to_list() == [int(t.replace(".", "")) for t in texts]


def test_a_dead_worker_changes_nothing(tmp_path):
    p = write_doc(tmp_path / "t.json.gz", big_doc(3000, seed=2), gz=True)
    want = parse_trace(p, workers=0)
    pool = parallel.get_pool(W)
    assert pool is not None
    w = pool.workers[0]
    w.kill()
    w.reader.join(30)  # the reader thread sees the pipe close
    assert not w.alive
    parallel.release_pool(pool)
    pools = parallel.STATS["pools"]
    assert_same_trace(parse_trace(p, workers=W, chunk_bytes=5000), want)
    assert_same_trace(parse_trace(p, workers=W, chunk_bytes=5000), want)
    assert parallel.STATS["pools"] == pools + 1  # a pool with a dead worker is replaced
    pool = parallel.get_pool(W)
    assert pool is not None and pool.wait_ready(120)
    parallel.release_pool(pool)


def test_salvage_is_serial(tmp_path):
    raw = orjson.dumps(big_doc(2000), option=orjson.OPT_INDENT_2)
    p = write_doc(tmp_path / "t.json", raw=raw[: len(raw) // 2])
    a = parse_trace(p, salvage=True, workers=W, chunk_bytes=3000)
    b = parse_trace(p, salvage=True, workers=0, chunk_bytes=3000)
    assert_same_trace(a, b)


def test_columns_are_dropped_the_same_way():
    """``columns`` (trace.compact): the workers' chunks are projected in the parent as its own."""
    path = TRACES_DIR / "hta/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz"
    cols = {"events": ("ts", "correlation", "input_dims"), "counters": ("value",)}
    par, ser = both(path, chunk_bytes=1 << 15, columns=cols)
    assert_same_trace(par, ser)
    assert par.flows.width == 0 and par.counters.columns == ["value"]
    assert par.events.columns == ["idx", "kind", "name", "ts", "dur", "correlation", "input_dims"]
