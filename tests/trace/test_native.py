"""The native (C) chunk decoder against the Python loader, its oracle (issue 14).

Both paths must give identical tables, metadata, warnings and errors: on every real trace of
tests/data/traces (and of /work/shared/traces when present), on hypothesis-generated
documents, and on hand-written edge cases (exact timestamps, escapes, compact JSON of list
arguments, values the native decoder must hand back to Python). ``_native.STATS`` shows which
path decoded the chunks, so a test cannot pass by never running the native code.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kinetoscope.trace import Trace, TraceError, _native, parse_trace
from tests.trace.conftest import assert_same_trace
from tests.trace.corpus import TRACES_DIR
from tests.trace.test_properties import SETTINGS, document

pytestmark = pytest.mark.skipif(not _native.available(), reason="the native decoder is not built")

SHARED = Path(os.environ.get("KSCOPE_SHARED_TRACES", "/work/shared/traces"))
Outcome = Trace | TraceError


@contextmanager
def native_env(on: bool) -> Iterator[None]:
    """``KSCOPE_NATIVE`` set for the duration (read when a parse starts)."""
    old = os.environ.get("KSCOPE_NATIVE")
    os.environ["KSCOPE_NATIVE"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["KSCOPE_NATIVE"]
        else:
            os.environ["KSCOPE_NATIVE"] = old


def outcome(fn: Callable[[], Trace]) -> Outcome:
    try:
        return fn()
    except TraceError as e:
        return e


def both(path: Path, **kw: Any) -> tuple[Outcome, Outcome, dict[str, int]]:
    """(native outcome, Python outcome, chunks decoded natively / handed back by the native path)."""
    kw.setdefault("workers", 0)
    before = dict(_native.STATS)
    with native_env(True):
        got = outcome(lambda: parse_trace(path, **kw))
    used = {k: _native.STATS[k] - before.get(k, 0) for k in ("native", "fallback")}
    with native_env(False):
        ref = outcome(lambda: parse_trace(path, **kw))
    assert _native.STATS["native"] == before.get("native", 0) + used["native"], (
        "KSCOPE_NATIVE=0 ran native code"
    )
    return got, ref, used


def assert_same(got: Outcome, ref: Outcome) -> None:
    if isinstance(ref, TraceError) or isinstance(got, TraceError):
        assert str(got) == str(ref)
        assert type(got) is type(ref)
        return
    assert_same_trace(got, ref)


def real_traces() -> list[Path]:
    """Every trace file of tests/data/traces, plus files of /work/shared/traces that are not
    byte-identical copies of those (same relative path and size)."""
    ours = sorted(p for p in TRACES_DIR.rglob("*") if p.name.endswith((".json", ".json.gz")))
    seen = {(str(p.relative_to(TRACES_DIR)), p.stat().st_size) for p in ours}
    extra = []
    if SHARED.is_dir():
        for p in sorted(SHARED.rglob("*")):
            if (
                p.name.endswith((".json", ".json.gz"))
                and (str(p.relative_to(SHARED)), p.stat().st_size) not in seen
            ):
                extra.append(p)
    return ours + extra


def _id(p: Path) -> str:
    for root in (TRACES_DIR, SHARED):
        if p.is_relative_to(root):
            return ("" if root == TRACES_DIR else "shared:") + str(p.relative_to(root))
    return str(p)


def test_extension_is_built_where_a_compiler_exists() -> None:
    """CI has gcc: the extension must be there (a silently skipped build would leave every
    test below skipped and the loader slow)."""
    if not (shutil.which("gcc") or shutil.which("cc")):
        pytest.skip("no C compiler")
    assert _native.available()


@pytest.mark.parametrize("path", real_traces(), ids=_id)
def test_real_traces_match_the_python_path(path: Path) -> None:
    got, ref, used = both(path)
    assert_same(got, ref)
    if isinstance(ref, Trace) and ref.meta.num_trace_events:
        assert used["native"] >= 1, "the native decoder decoded nothing"


def test_real_trace_in_small_chunks() -> None:
    """Many chunks, boundaries everywhere: labels, idx offsets and args columns line up."""
    path = TRACES_DIR / "hta" / "with_gpu_user_annotation" / "step_based_trace_2543932.json.gz"
    got, ref, used = both(path, chunk_bytes=3000, block_bytes=700)
    assert_same(got, ref)
    assert used["native"] > 50


def test_native_chunks_through_worker_processes() -> None:
    """The chunk workers use the native decoder too; the result equals the serial Python one."""
    path = TRACES_DIR / "hta" / "nccl_parser_config" / "nccl_data.json.gz"
    with native_env(True):
        got = parse_trace(path, workers=2, chunk_bytes=1 << 18)
    with native_env(False):
        ref = parse_trace(path, workers=0)
    assert_same_trace(got, ref)


def _write(tmp: Path, text: bytes) -> Path:
    p = tmp / "t.json"
    p.write_bytes(text)
    return p


def _events_doc(*events: str) -> bytes:
    return ('{"traceEvents": [' + ", ".join(events) + '], "traceName": "x"}').encode()


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("0.0005", 0),
        ("0.0015", 2),
        ("1.2345", 1234),
        ("1.2355", 1236),
        ("0.0025", 2),
        ("0.00251", 3),
        ("1712195495519761.132", 1712195495519761132),
        ("1.5e3", 1500000),
        ("2e-3", 2),
        ("2E+2", 200000),
        ("-0.0", 0),
        ("-0", 0),
        ("-3.5", -3500),
        ("9223372036854775", 9223372036854775000),
        ("-9223372036854775", -9223372036854775000),
        ("0.000000000000000000001", 0),
        ("123456789012345678e-15", 123457),
    ],
)
def test_exact_timestamps(tmp_path: Path, text: str, ns: int) -> None:
    doc = _events_doc(f'{{"ph": "X", "name": "a", "ts": {text}, "dur": {text}, "pid": 1, "tid": 1}}')
    got, ref, used = both(_write(tmp_path, doc))
    assert_same(got, ref)
    assert used["native"] == 1 and not used["fallback"]
    assert isinstance(got, Trace)
    assert got.events["ts"][0] == ns
    assert got.events["dur"][0] == max(ns, 0)  # negative durations become 0


@pytest.mark.parametrize(
    "event",
    [
        '{"ph": "X", "name": "a", "ts": "12.5", "dur": 1}',  # numeric string ts: Python's rule
        '{"ph": "X", "name": "a", "ts": 9223372036854776, "dur": 1}',  # out of range: the error
        '{"ph": "X", "name": "a", "ts": 1e400, "dur": 1}',
        '{"ph": "X", "ts": 1, "dur": 1}',  # no name: the error
        '{"ph": "X", "name": "a", "ts": 1}',  # no dur
        '{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 1.5}',
        '{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 9223372036854775808}',
        '{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": " 12 "}',
        '{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": []}',
        '{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"stream": "\u00a012"}}',  # a Unicode space
        '{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"stream": "99999999999999999999"}}',
        '{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"flops": "1.5"}}',
        '{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"External id": 18446744073709551615}}',
        '{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"grid": [1.5, 2]}}',
        '{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"grid": {"a": 1}}}',
        '{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"grid": [-0]}}',
        '{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"grid": ["\\u00e9"]}}',
        '{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"stream": 1, "stream": 2}}',
        '{"ph": "X", "name": "a", "ts": 1, "dur": 1, "ph": "X"}',
        '{"ph": "X", "cat": "cuda_profiler_range", "name": "a", "ts": 1, "dur": 1, "args": {"c": 1}}',
        '{"ph": "X", "cat": 5, "name": "a", "ts": 1, "dur": 1}',
        '{"ph": "Q", "name": "a"}',
        '{"ph": 5}',
        '{"name": "no phase"}',
        '{"ph": "C", "name": "c", "ts": 1, "args": {"v": "3.5"}}',
        '{"ph": "M", "name": "thread_name", "args": {"name": 5}}',
        '{"ph": "i", "ts": 1, "args": {"Bytes": "8"}}',
        '{"ph": "s", "id": "7", "ts": 1}',
        '{"ph": "X", "name": "\\ud800", "ts": 1, "dur": 1}',  # a lone surrogate
        '{"p\\u0068": "X", "name": "a", "ts": 1, "dur": 1}',  # an escaped key
    ],
)
def test_what_the_native_decoder_hands_back(tmp_path: Path, event: str) -> None:
    """Values only the Python rules judge: the chunk goes to the Python path, same outcome."""
    doc = _events_doc('{"ph": "X", "name": "first", "ts": 1, "dur": 1}', event)
    got, ref, used = both(_write(tmp_path, doc))
    assert_same(got, ref)
    assert used["fallback"] >= 1


@pytest.mark.parametrize(
    "event",
    [
        '{"ph": "X", "cat": "cpu_op", "name": "n\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude80\\u0000", "ts": 1, "dur": 2}',
        (
            '{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"Input Dims": [[1, 2], [], [3]], '
            '"Input type": ["float", "", "a\\"b\\\\c\\n"], "Concrete Inputs": ["", "1", "True"], '
            '"grid": [1, 2, 3], "block": 7, "dtype": true, "flops": 12, "blocks per SM": 0.25, '
            '"External id": 3, "external id": 4, "Call stack": [1.5, {"x": "y"}], "cbid": null}}'
        ),
        '{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"external id": 4, "External id": null}}',
        '{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"external id": 4, "External id": "0x5"}}',
        (
            '{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"stream": true, "device": false, "bytes": 2.9, '
            '"correlation": -7.5, "Seq": " +12 ", "Ev Idx": "-007", "Group size": "", "flops": true, "Python id": [1]}}'
        ),
        '{"ph": "X", "cat": null, "name": "a", "pid": "Spans", "tid": "", "ts": 1, "dur": 1}',
        '{"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 9, "pid": "Traces", "tid": 2, "ts": 5}',
        '{"ph": "f", "cat": "ac2g", "name": null, "id": null, "ts": 5.25, "bp": "e"}',
        '{"ph": "t", "id": 1}',
        (
            '{"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 3, '
            '"args": {"Bytes": 8, "Addr": -5, "Total Allocated": 9, "Device Id": 0, "Device Type": 1, "Total Reserved": 2}}'
        ),
        '{"ph": "I", "ts": 3, "args": null}',
        '{"ph": "C", "name": "q", "pid": 1, "ts": 5, "args": {"v": 1, "w": true, "x": null, "y": [1], "z": 2.5}}',
        '{"ph": "C", "name": "q", "ts": "not read: no args object", "args": 5}',
        '{"ph": "M", "name": "process_name", "pid": "Spans", "args": {"name": "p", "labels": "l", "sort_index": 3}}',
        '{"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": 2, "args": {"sort_index": -1}}',
        '{"ph": "B", "name": "skipped", "ts": "whatever", "pid": 1.5}',
        '{"ph": "X", "name": "u", "ts": 1, "dur": 1, "unknown": {"deep": [[[[1.5e999]]]]}, "Comms Id": 99999999999999999999999}',
    ],
)
def test_what_the_native_decoder_keeps(tmp_path: Path, event: str) -> None:
    doc = _events_doc('{"ph": "X", "name": "first", "pid": "Spans", "ts": 1, "dur": 1}', event)
    got, ref, used = both(_write(tmp_path, doc))
    assert_same(got, ref)
    assert used["native"] >= 1 and not used["fallback"], used


@pytest.mark.parametrize(
    "text",
    [
        b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1},]}',
        b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}',
        b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 01, "dur": 1}]}',
        b'{"traceEvents": [{"ph": "X", "name": "a\xff", "ts": 1, "dur": 1}]}',
        b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "x": NaN}]}',
        b'{"traceEvents": [{"ph": "X", "name": "a\x01", "ts": 1, "dur": 1}]}',
        b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}] "x": 1}',
        b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "a": '
        + b"[" * 70
        + b"]" * 70
        + b"}]}",
        b'[{"ph": "X", "name": "a", "ts": 1, "dur": 1}, 5]',
    ],
)
def test_bad_json_gives_the_python_error(tmp_path: Path, text: bytes) -> None:
    got, ref, _ = both(_write(tmp_path, text))
    assert_same(got, ref)


# ---------------------------------------------------------------------------------- random
_number = st.from_regex(r"\A-?(0|[1-9][0-9]{0,20})(\.[0-9]{1,14})?([eE][-+]?[0-9]{1,2})?\Z")
_odd_text = st.text(st.characters(codec="utf-8"), max_size=6)
_arg_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.floats(allow_nan=False) | _odd_text,
    lambda inner: st.lists(inner, max_size=3),
    max_leaves=8,
)


@st.composite
def raw_event(draw: st.DrawFn) -> str:
    """An event written as JSON text with number literals of any shape (exponents, many
    decimals, huge), escaped or raw unicode, and args values of every type."""
    ph = draw(st.sampled_from(["X", "X", "X", "s", "f", "i", "C", "M"]))
    fields = {
        "ph": json.dumps(ph),
        "name": json.dumps(draw(_odd_text), ensure_ascii=draw(st.booleans())),
        "ts": draw(_number),
        "pid": json.dumps(draw(st.integers(-5, 5) | st.sampled_from(["Spans", "", "7"]))),
    }
    if ph == "X":
        fields["dur"] = draw(_number)
    if ph in ("X", "C"):
        keys = st.sampled_from(
            ["Input Dims", "grid", "stream", "External id", "external id", "flops", "dtype", "v"]
        )
        args = draw(st.dictionaries(keys, _arg_value, max_size=4))
        fields["args"] = json.dumps(
            args, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 1]))
        )
    if ph == "i":
        fields["args"] = json.dumps({"Bytes": draw(st.integers(-(2**64), 2**64))})
    return "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"


@settings(
    SETTINGS,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(events=st.lists(raw_event(), max_size=12), chunk=st.sampled_from([None, 40, 300]))
def test_random_number_texts_and_values(
    tmp_path_factory: pytest.TempPathFactory, events: list[str], chunk: int | None
) -> None:
    path = _write(tmp_path_factory.mktemp("raw"), _events_doc(*events))
    got, ref, _ = both(path, chunk_bytes=chunk, block_bytes=chunk)
    assert_same(got, ref)


@SETTINGS
@given(doc=document(), indent=st.booleans(), chunk=st.sampled_from([None, 1, 50, 700]))
def test_random_documents(
    tmp_path_factory: pytest.TempPathFactory, doc: Any, indent: bool, chunk: int | None
) -> None:
    raw = orjson.dumps(doc, option=orjson.OPT_INDENT_2 if indent else 0)
    path = _write(tmp_path_factory.mktemp("doc"), raw)
    got, ref, _ = both(path, chunk_bytes=chunk, block_bytes=chunk)
    assert_same(got, ref)
