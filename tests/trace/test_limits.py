"""Issue 16 (loader): resource limits with clear errors, whitespace handled in linear work,
large top-level values streamed past, deep nesting and negative durations handled."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from kinetoscope.trace import TraceError, load_trace_reference, parse_trace
from kinetoscope.trace import decode as D
from kinetoscope.trace.limits import Limits, fmt_size, parse_size
from tests.report.kscope_testkit import env_with_repo

EV = b'{"ph":"X","name":"a","ts":1,"dur":2}'
MIB = 1 << 20
REPO_ROOT = Path(__file__).resolve().parents[2]


def doc(body: bytes) -> bytes:
    return b'{"traceEvents":[' + body + b"]}"


def err_of(path, **kw) -> TraceError:
    with pytest.raises(TraceError) as info:
        parse_trace(path, workers=0, **kw)
    assert info.value.path == str(path)
    return info.value


# ---- sizes ---------------------------------------------------------------------------------
def test_parse_size():
    assert (
        parse_size("8G", "x") == 8 << 30
        and parse_size("512MiB", "x") == 512 << 20
        and parse_size("100", "x") == 100
    )
    for bad in ("", "abc", "-1", "0", "1.5G"):
        with pytest.raises(Exception, match="not a size"):
            parse_size(bad, "--max-trace-bytes")
    assert fmt_size(16 << 30) == "16 GiB" and fmt_size(1000) == "1000 bytes"


@pytest.mark.parametrize("gz", [True, False])
def test_inflated_size_over_the_limit_is_refused(tmp_path, gz, monkeypatch):
    """Regression: a gzip of '{"traceEvents":[' + spaces + ']}' inflating to 5.5 GB was read to
    the end (5.3 GB RSS, > 400 s). Tests use 3 MiB against a 1 MiB limit."""
    raw = doc(b" " * (3 * MIB))
    p = tmp_path / ("bomb.json.gz" if gz else "bomb.json")
    p.write_bytes(gzip.compress(raw, 9) if gz else raw)
    err = err_of(p, limits=Limits(max_trace_bytes=MIB))
    assert (
        "larger than the 1 MiB limit on decompressed JSON" in err.problem
        and "KSCOPE_MAX_TRACE_BYTES" in err.problem
    )
    assert err.offset == MIB
    monkeypatch.setenv("KSCOPE_MAX_TRACE_BYTES", "1M")
    assert "1 MiB limit" in err_of(p).problem
    monkeypatch.setenv("KSCOPE_MAX_TRACE_BYTES", "4M")
    assert parse_trace(p, workers=0).meta.num_trace_events == 0


def test_whitespace_run_over_the_value_limit_is_refused(tmp_path):
    p = tmp_path / "t.json"
    p.write_bytes(doc(b" " * (3 * MIB)))
    err = err_of(p, limits=Limits(max_value_bytes=MIB))
    assert "of whitespace" in err.problem and "KSCOPE_MAX_VALUE_BYTES" in err.problem and err.offset == 16


@pytest.mark.parametrize("where", ["after_brace", "after_comma", "inside_event"])
def test_an_event_over_the_value_limit_is_refused(tmp_path, where):
    gap = b" " * (3 * MIB)
    body = {
        "after_brace": EV + gap + b"," + EV,
        "after_comma": EV + b"," + gap + EV,
        "inside_event": EV + b',{"ph":"X",' + gap + b'"name":"b","ts":1,"dur":2}',
    }[where]
    p = tmp_path / "t.json"
    p.write_bytes(doc(body))
    err = err_of(p, limits=Limits(max_value_bytes=MIB), chunk_bytes=4096, block_bytes=65536)
    assert "limit on one value" in err.problem and err.offset is not None and err.event_index is not None
    assert parse_trace(p, workers=0, chunk_bytes=4096, block_bytes=65536).meta.num_trace_events == 2


def _count_boundary_scans(monkeypatch) -> list[int]:
    scanned: list[int] = []
    real = D.EventStream._last_boundary

    def counting(self, lo, hi):
        scanned.append(max(0, hi - lo))
        return real(self, lo, hi)

    monkeypatch.setattr(D.EventStream, "_last_boundary", counting)
    return scanned


@pytest.mark.parametrize("where", ["after_brace", "after_comma", "inside_event", "many_gaps"])
def test_whitespace_between_events_costs_linear_work(tmp_path, monkeypatch, where):
    """Regression: time grew about quadratically with whitespace between events (100/200/400
    MB: 4.4/12.0/39.7 s) because each new block rescanned the whole gap for a boundary. The
    bytes handed to the boundary search now stay within a small multiple of the file size
    (no timing: the count of bytes searched is deterministic)."""
    gap = b" " * (8 * MIB)
    body = {
        "after_brace": EV + gap + b"," + EV,
        "after_comma": EV + b"," + gap + EV,
        "inside_event": EV + b',{"ph":"X",' + gap + b'"name":"b","ts":1,"dur":2}',
        "many_gaps": b",".join([EV + b" " * MIB] * 8),
    }[where]
    p = tmp_path / "t.json"
    p.write_bytes(doc(body))
    scanned = _count_boundary_scans(monkeypatch)
    t = parse_trace(p, workers=0, chunk_bytes=64 << 10, block_bytes=256 << 10)
    assert t.meta.num_trace_events == (8 if where == "many_gaps" else 2)
    assert sum(scanned) <= 3 * len(body), (sum(scanned), len(body))


def test_leading_whitespace_is_dropped_from_memory(tmp_path, monkeypatch):
    """'[' + blanks + ']': the blanks are skipped without keeping them (bounded buffer)."""
    p = tmp_path / "t.json"
    p.write_bytes(doc(b"\n" * (16 * MIB)))
    peak = [0]
    real = D.EventStream._more

    def watching(self):
        got = real(self)
        peak[0] = max(peak[0], len(self.buf))
        return got

    monkeypatch.setattr(D.EventStream, "_more", watching)
    assert parse_trace(p, workers=0, block_bytes=MIB).meta.num_trace_events == 0
    assert peak[0] <= 4 * MIB


# ---- large top-level values -------------------------------------------------------------
@pytest.mark.parametrize(
    "value",
    [
        b'"' + b"x" * (2 * MIB) + b'"',
        b'"' + b'\\"}]{[' * (MIB // 3) + b'"',
        b'{"a": "' + b"y" * (2 * MIB) + b'", "b": [1, {"c": "}"}]}',
        b"[" + b"1," * MIB + b"1]",
    ],
)
def test_a_top_level_value_over_the_decode_limit_is_streamed_past(tmp_path, monkeypatch, value):
    """Regression: a top-level value over 64 MiB before traceEvents gave "not a trace: no
    'traceEvents' key" (a skipped string swallowed the rest of the document). The limit is
    lowered to 1 MiB here."""
    monkeypatch.setattr(D, "META_VALUE_LIMIT", MIB)
    p = tmp_path / "t.json"
    p.write_bytes(b'{"big": ' + value + b', "traceEvents": [' + EV + b'], "after": 7}')
    t = parse_trace(p, workers=0, block_bytes=64 << 10)  # read in steps, as a large file is
    assert t.meta.num_trace_events == 1
    assert any("top-level key 'big' holds" in w and "skipped" in w for w in t.meta.warnings)


def test_a_huge_top_level_key_is_refused(tmp_path):
    p = tmp_path / "t.json"
    p.write_bytes(b'{"' + b"k" * (3 * MIB))
    assert "top-level key string longer than" in err_of(p).problem


# ---- nesting, negative durations -----------------------------------------------------------
@pytest.mark.parametrize("depth", [1000, 100_000])
@pytest.mark.parametrize("where", ["args", "top", "legacy"])
def test_deep_nesting_is_a_trace_error(tmp_path, depth, where):
    """Regression: JSON nested ~1,000 deep in args raised RecursionError from _decode_mv."""
    nest = b"[" * depth + b"]" * depth
    text = {
        "args": b'{"traceEvents":[{"ph":"X","name":"a","ts":1,"dur":1,"args":{"x":%s}}]}' % nest,
        "top": b'{"meta":%s,"traceEvents":[]}' % nest,
        "legacy": b'[{"ph":"X","name":"a","ts":1,"dur":1,"args":{"x":%s}}]' % nest,
    }[where]
    p = tmp_path / "t.json"
    p.write_bytes(text)
    for load in (lambda: parse_trace(p, workers=0), lambda: load_trace_reference(p)):
        try:
            load()
        except TraceError as e:
            assert e.path == str(p) and e.offset is not None
            assert "nested too deeply" in e.problem or "depth limit" in e.problem


def test_negative_dur_is_clamped_with_a_warning_naming_the_event(tmp_path):
    p = tmp_path / "t.json"
    p.write_bytes(
        orjson.dumps(
            {
                "traceEvents": [
                    {"ph": "X", "name": "ok", "ts": 1, "dur": 2},
                    {"ph": "X", "name": "backwards", "ts": 5, "dur": -3.5},
                    {"ph": "X", "name": "also", "ts": 9, "dur": -1},
                ]
            }
        )
    )
    want = "2 complete event(s) have a negative dur and were given dur 0 (first: traceEvents[1] 'backwards', dur -3.5 us)"
    for t in (parse_trace(p), load_trace_reference(p)):
        assert t.events["dur"].to_list() == [2000, 0, 0]
        assert want in t.meta.warnings


# ---- CLI -------------------------------------------------------------------------------------
def test_cli_max_trace_bytes(tmp_path):
    p = tmp_path / "rank-0.json"
    p.write_bytes(doc(b" " * 4096 + EV))

    def kscope(*args):
        return subprocess.run(
            [sys.executable, "-m", "kinetoscope.cli.main", *args],
            cwd=REPO_ROOT,
            env=env_with_repo(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    r = kscope("--max-trace-bytes", "1K", "analyze", str(p), "--no-cache")
    assert (
        r.returncode != 0 and "1 KiB limit on decompressed JSON" in r.stderr and "Traceback" not in r.stderr
    )
    assert len(r.stderr.strip().splitlines()) <= 2
    r = kscope("--max-trace-bytes", "lots", "analyze", str(p))
    assert r.returncode == 2 and "not a size" in r.stderr and "Traceback" not in r.stderr
