"""Property tests: random small traces load exactly as the reference loader loads them (values
round-trip), and any truncation raises nothing but TraceError (or salvages)."""

from __future__ import annotations

import gzip
import os
from decimal import ROUND_HALF_EVEN, Decimal

import orjson
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from kinetoscope.trace import TraceError, load_trace_reference, parse_trace
from kinetoscope.trace.schema import ARG_COLUMNS
from tests.trace.conftest import assert_same_trace

# max_examples, derandomize and the deadline come from the profile (tests/conftest.py:
# HYPOTHESIS_PROFILE=ci|slow|fuzz); KSCOPE_HYPOTHESIS_EXAMPLES still overrides the count
_EXAMPLES = os.environ.get("KSCOPE_HYPOTHESIS_EXAMPLES")
SETTINGS = settings(
    **({"max_examples": int(_EXAMPLES)} if _EXAMPLES else {}),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# Found by the random search (issue 10): a pid outside int64 in a chunk the fast path starts
# and then hands to the reference path (the string ts) was counted by both paths.
_OOR_PID_FALLBACK = [
    {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 0, "ts": 0},
    {"ph": "X", "cat": "kernel", "name": "", "ts": "0.0", "dur": 0, "pid": 9_223_372_036_854_775_808},
    {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 0, "ts": 0},
    {"ph": "X", "cat": "kernel", "name": "", "ts": 0, "dur": 0},
    {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 0, "ts": 100000000000.0},
    {"ph": "X", "cat": "kernel", "name": "", "ts": 0, "dur": 0},
]

text = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ["<script>alert(1)</script>", "}, {", '"\\', "\u0000\u001f", "名前🚀", "ProfilerStep#4"]
)
u64 = st.integers(-(2**63), 2**64 - 1)
small_int = st.integers(-1000, 10**6)
ident = st.one_of(small_int, u64, text, st.sampled_from(["Spans", "Traces", "", "12", " 7 ", "-3"]))
usec = st.one_of(
    st.integers(-(10**12), 10**15),
    st.floats(-1e12, 1e12, allow_nan=False, allow_infinity=False),
    st.floats(0, 9e15, allow_nan=False, allow_infinity=False),
    st.integers(0, 10**6).map(lambda x: f"{x / 8}"),
)
scalar = st.one_of(
    st.none(), st.booleans(), small_int, u64, st.floats(allow_nan=False, allow_infinity=False), text
)
value = st.one_of(scalar, st.lists(st.one_of(small_int, text, st.lists(small_int, max_size=3)), max_size=4))
arg_keys = st.sampled_from(list(ARG_COLUMNS) + ["cbid", "Call stack", "Comms Id"])
args = st.dictionaries(arg_keys, value, max_size=6)
cats = (
    st.sampled_from(
        [
            "kernel",
            "Kernel",
            "cpu_op",
            "cuda_runtime",
            "Runtime",
            "gpu_memcpy",
            "Memset",
            "user_annotation",
            "mtia_ccp_events",
            "python_function",
            "Trace",
        ]
    )
    | text
)


@st.composite
def event(draw):
    ph = draw(st.sampled_from(["X", "X", "X", "X", "s", "f", "M", "i", "C", "B"]))
    e: dict = {"ph": ph}
    if ph == "X":
        e.update(cat=draw(cats), name=draw(text), ts=draw(usec), dur=draw(usec))
        if draw(st.booleans()):
            e["args"] = draw(args)
    elif ph in "sf":
        e.update(cat="ac2g", name="ac2g", id=draw(st.one_of(small_int, u64)), ts=draw(usec))
        if ph == "f":
            e["bp"] = "e"
    elif ph == "M":
        e.update(
            name=draw(
                st.sampled_from(
                    [
                        "process_name",
                        "process_labels",
                        "process_sort_index",
                        "thread_name",
                        "thread_sort_index",
                        "other",
                    ]
                )
            ),
            args={"name": draw(text), "labels": draw(text), "sort_index": draw(small_int)},
        )
    elif ph == "i":
        e.update(
            name="[memory]",
            s="t",
            ts=draw(usec),
            args={"Bytes": draw(st.one_of(small_int, u64)), "Addr": draw(small_int)},
        )
    elif ph == "C":
        e.update(
            name=draw(text),
            ts=draw(small_int),
            args=draw(st.dictionaries(text, st.one_of(small_int, text), max_size=3)),
        )
    else:
        e.update(name=draw(text), ts=draw(small_int))
    if draw(st.integers(0, 5)):
        e["pid"] = draw(ident)
    if draw(st.integers(0, 5)):
        e["tid"] = draw(ident)
    return e


@st.composite
def document(draw):
    events = draw(st.lists(event(), max_size=40))
    if draw(st.integers(0, 9)) == 0:
        return events  # legacy: the file is the array
    doc = {"schemaVersion": 1, "traceEvents": events}
    if draw(st.booleans()):
        doc["distributedInfo"] = {"rank": draw(st.integers(0, 64)), "world_size": 64}
    if draw(st.booleans()):
        doc = {**doc, "traceName": draw(text), "baseTimeNanoseconds": draw(u64)}
    return doc


def encode(doc, indent: bool, gz: bool) -> bytes:
    raw = orjson.dumps(doc, option=orjson.OPT_INDENT_2 if indent else 0)
    return gzip.compress(raw, 1) if gz else raw


def outcome(fn):
    try:
        return fn()
    except TraceError as e:
        return e


@SETTINGS
@given(doc=document(), indent=st.booleans(), gz=st.booleans(), chunk=st.sampled_from([None, 1, 50, 700]))
@example(doc=_OOR_PID_FALLBACK, indent=False, gz=False, chunk=None)
def test_random_traces_match_reference(tmp_path_factory, doc, indent, gz, chunk):
    p = tmp_path_factory.mktemp("prop") / ("t.json.gz" if gz else "t.json")
    p.write_bytes(encode(doc, indent, gz))
    ref = outcome(lambda: load_trace_reference(p))
    got = outcome(lambda: parse_trace(p, chunk_bytes=chunk, block_bytes=chunk))
    if isinstance(ref, TraceError):
        assert isinstance(got, TraceError), f"reference failed ({ref}) but the fast loader did not"
        if ref.event_index is not None and got.event_index is not None:
            assert got.event_index == ref.event_index
        return
    assert not isinstance(got, TraceError), got
    assert_same_trace(got, ref)
    # values round-trip: names, raw categories, timestamps in ns
    events = doc if isinstance(doc, list) else doc["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert got.events["name"].to_list() == [e["name"] for e in xs]
    assert got.events["cat"].to_list() == [e["cat"] for e in xs]

    def ns(v):
        # exact decimal rule: the text orjson wrote for a float is its shortest repr
        if isinstance(v, int):
            return v * 1000
        d = Decimal(v if isinstance(v, str) else repr(v)) * 1000
        return int(d.to_integral_value(rounding=ROUND_HALF_EVEN))

    assert got.events["ts"].to_list() == [ns(e["ts"]) for e in xs]
    assert got.meta.num_trace_events == len(events)


@pytest.mark.parametrize("pid", [2**63, 2**64 - 1, "99999999999999999999"])
@pytest.mark.parametrize("fallback_ts", ["0.0", 100000000000.25, 0])
def test_out_of_range_pids_are_counted_once_per_event(tmp_path, pid, fallback_ts):
    """Regression (issue 10 item 5): each pid/tid outside int64 counts once, whichever path
    (typed, typed then decoded again, typed then reference) builds its chunk, and a numeric
    string counts once per event (not once per distinct value), as the reference counts."""
    # the epoch-sized float ts makes the loader decode timestamps as text (Raw) from the start
    events = [
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 0, "ts": 100000000000.0, "pid": pid},
        {"ph": "X", "cat": "kernel", "name": "a", "ts": fallback_ts, "dur": 0, "pid": pid, "tid": "x"},
        {"ph": "X", "cat": "kernel", "name": "b", "ts": 1, "dur": 0, "pid": pid},
    ]
    p = tmp_path / "t.json"
    p.write_bytes(orjson.dumps({"traceEvents": events}))
    want = "3 pid/tid value(s) do not fit in int64 and were stored as null"
    assert want in load_trace_reference(p).meta.warnings
    assert want in parse_trace(p).meta.warnings


@SETTINGS
@given(
    doc=document(),
    indent=st.booleans(),
    gz=st.booleans(),
    cut=st.floats(0, 1),
    salvage=st.booleans(),
    chunk=st.sampled_from([None, 7, 300]),
)
def test_random_truncation_only_raises_trace_error(tmp_path_factory, doc, indent, gz, cut, salvage, chunk):
    raw = orjson.dumps(doc, option=orjson.OPT_INDENT_2 if indent else 0)
    cut_raw = raw[: int(len(raw) * cut)]
    assume(cut_raw != raw)
    p = tmp_path_factory.mktemp("cut") / ("t.json.gz" if gz else "t.json")
    p.write_bytes(gzip.compress(cut_raw, 1) if gz else cut_raw)
    try:
        t = parse_trace(p, salvage=salvage, chunk_bytes=chunk, block_bytes=chunk)
    except TraceError as e:
        assert e.path == str(p)
        assert e.offset is not None or e.event_index is not None or "empty" in e.problem
        return
    # only salvage can turn a truncated document into a trace
    assert salvage
    assert t.meta.warnings and t.meta.warnings[0].startswith("salvaged")
    events = doc if isinstance(doc, list) else doc["traceEvents"]
    assert t.meta.num_trace_events <= len(events)


@pytest.mark.parametrize("seed", range(3))
def test_random_bytes_only_raise_trace_error(tmp_path, seed):
    import random

    rnd = random.Random(seed)
    base = orjson.dumps(
        {"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "args": {"stream": 1}}] * 20}
    )
    for _ in range(150):
        b = bytearray(base)
        for _ in range(rnd.randint(1, 4)):
            b[rnd.randrange(len(b))] = rnd.randrange(256)
        p = tmp_path / "t.json"
        p.write_bytes(bytes(b))
        for salvage in (False, True):
            try:
                parse_trace(p, salvage=salvage, chunk_bytes=rnd.choice([None, 40]))
            except TraceError:
                pass
