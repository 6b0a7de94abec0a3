"""salvage=True keeps every complete event of a truncated or damaged file and says what was lost."""

from __future__ import annotations

import gzip
import shutil

import orjson
import pytest

from kinetoscope.trace import TraceError, load_trace, load_trace_reference, parse_trace
from tests.trace.conftest import TABLES, write_doc
from tests.trace.test_errors import DOC, complete_events


def expected_tables(tmp_path, events, n):
    """Reference tables for the first n events of ``events``."""
    p = write_doc(tmp_path / "expected.json", {"traceEvents": events[:n]})
    return load_trace_reference(p)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("frac", [0.02, 0.2, 0.41, 0.5, 0.77, 0.95, 0.98])
def test_salvage_truncated_events(tmp_path, gz, frac):
    raw = orjson.dumps(DOC, option=orjson.OPT_INDENT_2)
    start, end = raw.index(b'"traceEvents"'), raw.index(b"\n  ],")
    cut = raw[: int(len(raw) * frac)]
    assert start < len(cut) < end
    p = write_doc(tmp_path / ("t.json.gz" if gz else "t.json"), raw=cut, gz=gz)
    t = load_trace(p, salvage=True, cache=False)
    n = complete_events(cut)
    assert len(t.events) == n
    assert t.meta.num_trace_events == n
    assert t.meta.warnings[0].startswith(f"salvaged {n} complete event(s)")
    assert "truncated" in t.meta.warnings[0] or "ends" in t.meta.warnings[0]
    want = expected_tables(tmp_path, DOC["traceEvents"], n)
    for name in TABLES:
        assert getattr(t, name).equals(getattr(want, name)), name


def test_salvage_truncated_gzip_stream(tmp_path):
    raw = orjson.dumps(DOC, option=orjson.OPT_INDENT_2)
    gz = gzip.compress(raw)
    p = tmp_path / "t.json.gz"
    p.write_bytes(gz[: int(len(gz) * 0.6)])
    t = load_trace(p, salvage=True, cache=False)
    assert 0 < len(t.events) < 50
    assert "gzip stream ends early" in t.meta.warnings[0]
    assert t.events["name"].to_list() == [f"k{i}" for i in range(len(t.events))]


def test_salvage_cut_in_trailing_metadata_keeps_everything(tmp_path):
    raw = orjson.dumps(DOC, option=orjson.OPT_INDENT_2)
    cut = raw[: raw.index(b'"traceName"') + 8]
    t = load_trace(write_doc(tmp_path / "t.json", raw=cut), salvage=True, cache=False)
    assert len(t.events) == 50
    assert "salvaged 50" in t.meta.warnings[0]
    with pytest.raises(TraceError):
        load_trace(tmp_path / "t.json", cache=False)


def test_salvage_cut_before_events_is_still_an_error(tmp_path):
    raw = orjson.dumps(DOC, option=orjson.OPT_INDENT_2)
    p = write_doc(tmp_path / "t.json", raw=raw[:10])
    with pytest.raises(TraceError) as info:
        load_trace(p, salvage=True, cache=False)
    assert "truncated" in info.value.problem


def test_salvage_stops_at_corruption(tmp_path):
    raw = orjson.dumps(DOC, option=orjson.OPT_INDENT_2)
    i = raw.index(b'"name": "k30"')
    bad = raw[:i] + b"@@" + raw[i:]
    t = load_trace(write_doc(tmp_path / "t.json", raw=bad), salvage=True, cache=False)
    assert len(t.events) == 30
    assert "invalid JSON" in t.meta.warnings[0]


def test_salvage_of_a_complete_file_changes_nothing(tmp_path, hta_traces):
    src = hta_traces / "critical_path" / "alexnet" / "benchmark_result_2869224_1695835535_trace.json.gz"
    a = load_trace(src, salvage=True, cache=False)
    b = load_trace(src, cache=False)
    assert a.meta.warnings == b.meta.warnings
    for name in TABLES:
        assert getattr(a, name).equals(getattr(b, name))


@pytest.mark.parametrize("frac", [0.13, 0.5, 0.86])
def test_salvage_real_trace(tmp_path, hta_traces, frac):
    src = hta_traces / "critical_path" / "alexnet" / "benchmark_result_2869224_1695835535_trace.json.gz"
    raw = gzip.decompress(src.read_bytes())
    cut = raw[: int(len(raw) * frac)]
    p = write_doc(tmp_path / "t.json", raw=cut)
    for chunk in (None, 2048):
        t = parse_trace(p, salvage=True, chunk_bytes=chunk, block_bytes=chunk)
        n = complete_events(cut)
        assert t.meta.num_trace_events == n
        full = load_trace_reference(src)
        assert t.events.equals(full.events.filter(full.events["idx"] < n))
        assert t.flows.equals(full.flows.filter(full.flows["idx"] < n))


def test_salvaged_load_is_cached_separately(tmp_path):
    raw = orjson.dumps(DOC, option=orjson.OPT_INDENT_2)
    p = write_doc(tmp_path / "t.json", raw=raw[: len(raw) // 2])
    from kinetoscope.trace import cache

    before = cache.STATS["hit"]
    a = load_trace(p, salvage=True)
    b = load_trace(p, salvage=True)
    assert cache.STATS["hit"] == before + 1
    assert b.events.equals(a.events) and b.meta.warnings == a.meta.warnings
    with pytest.raises(TraceError):
        load_trace(p)
    shutil.rmtree(tmp_path, ignore_errors=True)
