"""Bad input -> TraceError naming the file and the byte offset / event index, with a message a
user can act on. Hostile but valid strings load as data."""

from __future__ import annotations

import gzip

import orjson
import pytest

from kinetoscope.trace import TraceError, load_trace, load_trace_reference
from tests.trace.conftest import assert_same_trace, write_doc


def ev(i: int, **kw):
    e = {
        "ph": "X",
        "cat": "kernel",
        "name": f"k{i}",
        "pid": 0,
        "tid": 7,
        "ts": 1000 + i,
        "dur": 5,
        "args": {"stream": 7, "correlation": i},
    }
    e.update(kw)
    return e


DOC = {"schemaVersion": 1, "traceEvents": [ev(i) for i in range(50)], "traceName": "x"}


def complete_events(data: bytes, prefix: str = "traceEvents.item") -> int:
    """How many complete events a streaming parser (ijson) yields before the data ends."""
    import io

    import ijson

    n = 0
    try:
        for _ in ijson.items(io.BytesIO(data), prefix, use_float=True):
            n += 1
    except ijson.common.IncompleteJSONError:
        pass
    return n


def load_err(path, **kw) -> TraceError:
    with pytest.raises(TraceError) as info:
        load_trace(path, cache=False, **kw)
    err = info.value
    assert err.path == str(path)
    assert str(path) in str(err)
    return err


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("frac", [0.05, 0.33, 0.5, 0.9, 0.999])
def test_truncated_file(tmp_path, gz, frac):
    raw = orjson.dumps(DOC, option=orjson.OPT_INDENT_2)
    cut = raw[: int(len(raw) * frac)]
    p = write_doc(tmp_path / ("t.json.gz" if gz else "t.json"), raw=cut, gz=gz)
    err = load_err(p)
    assert "truncated" in err.problem
    assert err.offset == len(cut)
    start, end = raw.index(b'"traceEvents"'), raw.index(b"\n  ],")
    if start < len(cut) < end:
        # the index of the first incomplete event = the number of complete ones (ijson agrees)
        assert err.event_index == complete_events(cut)
        assert f"traceEvents[{err.event_index}]" in str(err)


def test_truncated_gzip_stream(tmp_path):
    gz = gzip.compress(orjson.dumps(DOC))
    p = tmp_path / "t.json.gz"
    p.write_bytes(gz[: len(gz) // 2])
    err = load_err(p)
    assert "gzip stream ends early" in err.problem and err.offset is not None


@pytest.mark.parametrize("members", [1, 3])
def test_corrupt_gzip_crc_names_the_end_of_the_stream(tmp_path, members):
    """Regression (issue 16): a CRC error said "byte 0"; it now says what failed and where the
    damaged member ends in the decompressed data."""
    raw = orjson.dumps(DOC)
    parts = [gzip.compress(b" " * 100) for _ in range(members - 1)] + [gzip.compress(raw)]
    gz = bytearray(b"".join(parts))
    gz[-8] ^= 0xFF  # CRC of the last member
    p = tmp_path / "t.json.gz"
    p.write_bytes(bytes(gz))
    err = load_err(p)
    assert "gzip CRC mismatch at the end of the stream" in err.problem
    assert err.offset == 100 * (members - 1) + len(raw) and "(byte 0)" not in str(err)


def test_corrupt_deflate_data(tmp_path):
    gz = bytearray(gzip.compress(orjson.dumps(DOC) * 50))
    gz[len(gz) // 2 : len(gz) // 2 + 8] = b"\xff" * 8
    p = tmp_path / "t.json.gz"
    p.write_bytes(bytes(gz))
    err = load_err(p)
    assert "gzip" in err.problem and err.offset is not None


def test_garbage_after_gzip_magic(tmp_path):
    p = tmp_path / "t.json.gz"
    p.write_bytes(b"\x1f\x8b" + b"not deflate data at all" * 10)
    err = load_err(p)
    assert "gzip" in err.problem


def test_trailing_comma_in_events(tmp_path):
    raw = orjson.dumps(DOC, option=orjson.OPT_INDENT_2)
    i = raw.rindex(b"}\n  ]")
    bad = raw[: i + 1] + b"," + raw[i + 1 :]
    p = write_doc(tmp_path / "t.json", raw=bad)
    err = load_err(p)
    assert "trailing comma" in err.problem
    assert bad[err.offset : err.offset + 1] == b"]"


def test_trailing_comma_in_legacy_array(tmp_path):
    p = write_doc(tmp_path / "t.json", raw=b'[{"ph": "X", "name": "a", "ts": 1, "dur": 1},]')
    err = load_err(p)
    assert "trailing comma" in err.problem and err.offset == 45


def test_trailing_comma_in_object(tmp_path):
    p = write_doc(tmp_path / "t.json", raw=b'{"traceEvents": [], "a": 1, }')
    err = load_err(p)
    assert "trailing comma" in err.problem and err.offset == 28


def test_invalid_utf8_in_a_name(tmp_path):
    raw = orjson.dumps(DOC, option=orjson.OPT_INDENT_2).replace(b'"k17"', b'"k\xff7"')
    p = write_doc(tmp_path / "t.json", raw=raw)
    err = load_err(p)
    assert "UTF-8" in err.problem
    assert raw[err.offset] == 0xFF


def test_syntax_error_mid_file(tmp_path):
    raw = orjson.dumps(DOC, option=orjson.OPT_INDENT_2)
    i = raw.index(b'"name": "k30"')
    bad = raw[:i] + b'"name" "k30"' + raw[i + len(b'"name": "k30"') :]
    p = write_doc(tmp_path / "t.json", raw=bad)
    err = load_err(p)
    assert "invalid JSON" in err.problem
    assert abs(err.offset - (i + len(b'"name" '))) <= 1


@pytest.mark.parametrize(
    "raw, problem",
    [
        (b"", "empty file"),
        (b"   \n\t ", "empty file"),
        (b"42", "top-level JSON is a number"),
        (b'"x"', "top-level JSON is a string"),
        (b"null", "top-level JSON is null"),
        (b"hello", "top-level JSON is not JSON"),
        (b'{"a": 1}', "no 'traceEvents' key"),
        (b"{}", "no 'traceEvents' key"),
        (b'{"traceEvents": {}}', "'traceEvents' is not an array"),
        (b'{"traceEvents": [], "traceEvents": []}', "appears twice"),
        (b'{"traceEvents": []} x', "trailing data"),
        (b"[[1, 2], [3, 4]]", "not a trace: a JSON array whose items are not event objects"),
        (b'{"traceEvents": [1, 2]}', "event is a number, not an object"),
    ],
)
def test_not_a_trace_shapes(tmp_path, raw, problem):
    p = write_doc(tmp_path / "t.json", raw=raw)
    err = load_err(p)
    assert problem in err.problem, err.problem


def test_empty_gzip(tmp_path):
    p = write_doc(tmp_path / "t.json.gz", raw=b"", gz=True)
    assert "empty file" in load_err(p).problem


def test_execution_trace_hint(hta_traces):
    err = load_err(hta_traces / "execution_trace" / "benchmark_simple_add_et.json.gz")
    assert "Execution Trace" in err.problem


def test_memory_timeline_is_not_a_trace(hta_traces):
    err = load_err(hta_traces / "memory_analysis" / "memory_timeline.raw.gz")
    assert err.event_index == 0 and "not event objects" in err.problem


def test_missing_and_directory(tmp_path):
    assert "no such file" in load_err(tmp_path / "nope.json").problem
    assert "directory" in load_err(tmp_path).problem


@pytest.mark.parametrize(
    "patch, problem, field",
    [
        ({"name": None}, "without a string 'name'", "name"),
        ({"name": 5}, "without a string 'name'", "name"),
        ({"ts": "soon"}, "ts is not a number", "ts"),
        ({"ts": True}, "ts must be a number, got bool", "ts"),
        ({"ts": None}, "ts must be a number, got null", "ts"),
        ({"dur": [1]}, "dur must be a number, got list", "dur"),
        ({"ts": 1e300}, "ts is out of range", "ts"),
    ],
)
def test_bad_complete_event(tmp_path, patch, problem, field):
    events = [ev(i) for i in range(40)]
    events[23].update(patch)
    p = write_doc(tmp_path / "t.json", {"traceEvents": events})
    err = load_err(p)
    assert problem in err.problem and err.event_index == 23 and err.field == field


@pytest.mark.parametrize("missing", ["ts", "dur"])
def test_complete_event_missing_field(tmp_path, missing):
    events = [ev(i) for i in range(40)]
    del events[31][missing]
    p = write_doc(tmp_path / "t.json", {"traceEvents": events})
    err = load_err(p)
    assert err.problem == f"complete event without '{missing}'" and err.event_index == 31


def test_number_out_of_range_in_args(tmp_path):
    raw = orjson.dumps({"traceEvents": [ev(i) for i in range(10)]}).replace(
        b'"correlation":4', b'"correlation":1e400'
    )
    p = write_doc(tmp_path / "t.json", raw=raw)
    err = load_err(p)
    assert "out of range" in err.problem and err.event_index == 4


def test_errors_in_later_chunks_name_the_right_event(tmp_path):
    events = [ev(i) for i in range(3000)]
    events[2711]["ts"] = "later"
    p = write_doc(tmp_path / "t.json", {"traceEvents": events})
    from kinetoscope.trace import parse_trace

    with pytest.raises(TraceError) as info:
        parse_trace(p, chunk_bytes=4096, block_bytes=1000)
    assert info.value.event_index == 2711


HOSTILE = [
    "<script>alert('x')</script>",
    "a\u0000b\u0001c\u001f",
    '"quoted" \\ back\\slash },{ "ph": "X" }, {',
    "名前 🚀 \u202e rtl",
    "x" * 300_000,
    '}, {"ph": "X", "name": "fake", "ts": 1, "dur": 1}, {',
]


def test_hostile_strings_load_as_data(tmp_path):
    events = [ev(i, name=name, cat=name[:50]) for i, name in enumerate(HOSTILE)]
    events.append({"ph": "M", "name": "process_name", "pid": HOSTILE[0], "args": {"name": HOSTILE[2]}})
    events.append({"ph": "i", "name": HOSTILE[3], "pid": HOSTILE[1], "tid": HOSTILE[5], "ts": 3, "s": "g"})
    doc = {"traceEvents": events, HOSTILE[0]: HOSTILE[2]}
    p = write_doc(tmp_path / "t.json", doc)
    from kinetoscope.trace import parse_trace

    for cb in (None, 256, 4096):
        t = parse_trace(p, chunk_bytes=cb, block_bytes=cb)
        assert t.events["name"].to_list() == HOSTILE
        assert t.processes["name"].to_list() == [HOSTILE[2]]
        assert t.meta.extra[HOSTILE[0]] == HOSTILE[2]
        assert_same_trace(t, load_trace_reference(p))


@pytest.mark.parametrize("ph", [[], {}, 1, None, ["X"]])
def test_a_phase_that_is_not_a_string_is_ignored(tmp_path, ph):
    """Found by tests/fuzz: a list or object as ``ph`` raised TypeError (unhashable) in the
    reference rules that odd chunks fall back to; it is an unknown phase, like a number."""
    from kinetoscope.trace import load_trace_reference, parse_trace

    p = tmp_path / "t.json"
    p.write_bytes(
        orjson.dumps({"traceEvents": [{"ph": ph, "name": "a"}, {"ph": "X", "name": "b", "ts": 1, "dur": 1}]})
    )
    for t in (parse_trace(p), load_trace_reference(p)):
        assert t.events["name"].to_list() == ["b"] and t.meta.num_trace_events == 2
