"""Issue 32 (loader): each run of whitespace gets the value limit (not the whole file), a
gzip bomb of valid events stops at the event limit, and a FIFO is refused without blocking."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kinetoscope.trace import TraceError, load_trace_reference, parse_trace
from kinetoscope.trace.limits import Limits

EV = b'{"ph":"X","name":"a","ts":1,"dur":2,"pid":1,"tid":1}'
KIB = 1 << 10


def doc(body: bytes) -> bytes:
    return b'{"traceEvents":[' + body + b"]}"


@pytest.mark.parametrize("where", ["before ','", "after ','"])
@pytest.mark.parametrize("native", ["1", "0"])
def test_each_run_of_whitespace_is_limited_on_its_own(tmp_path, monkeypatch, where, native):
    """Regression: ``[ev, 100 MB blanks, ev, 100 MB blanks, ...]`` was refused ("no end of
    traceEvents[0] within 256 MiB") though each run is under the limit: the backwards search for
    a boundary overlapped its windows by 256 bytes only, so a separator longer than that which
    straddled two windows was never found. Scaled down: runs of 700 KiB under a 1 MiB limit,
    eight of them (5.6 MiB in all, over the limit together)."""
    monkeypatch.setenv("KSCOPE_NATIVE", native)
    blank = b" " * (700 * KIB)
    sep = (lambda: blank + b",") if where == "before ','" else (lambda: b"," + blank)
    p = tmp_path / "blanks.json"
    p.write_bytes(doc(b"".join(EV + sep() for _ in range(8)) + EV))
    limits = Limits(max_value_bytes=1 << 20)
    for chunk in (4 * KIB, None):
        t = parse_trace(p, workers=0, limits=limits, chunk_bytes=chunk, block_bytes=64 * KIB)
        assert t.events.height == 9
    assert load_trace_reference(p).events.height == 9


def test_a_run_over_the_limit_is_still_refused(tmp_path):
    """The fix does not lift the limit: one run over it is refused as before."""
    p = tmp_path / "blanks.json"
    p.write_bytes(doc(EV + b"," + b" " * (1200 * KIB) + EV))
    with pytest.raises(TraceError, match="KSCOPE_MAX_VALUE_BYTES"):
        parse_trace(
            p, workers=0, limits=Limits(max_value_bytes=1 << 20), chunk_bytes=4 * KIB, block_bytes=64 * KIB
        )


# ---- non-regular files ------------------------------------------------------------------------
def _fifo(tmp_path: Path) -> Path:
    p = tmp_path / "rank-0.json"
    os.mkfifo(p)
    return p


def _in_child(code: str, path: Path) -> str:
    """Run ``code`` (with ``P`` = path) in a subprocess so that a hang cannot hang the suite:
    a generous timeout, then whatever it printed."""
    import subprocess
    import sys

    from tests.report.kscope_testkit import env_with_repo

    out = subprocess.run(
        [sys.executable, "-c", f"P = {str(path)!r}\n" + code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env_with_repo(),
    )
    return out.stdout + out.stderr


@pytest.mark.parametrize(
    "call",
    [
        "load_trace(P)",
        "load_trace(P, cache=False)",
        "parse_trace(P)",
        "load_trace_reference(P)",
        "load_traces([P])",
    ],
)
def test_a_fifo_is_refused_with_one_line(tmp_path, call):
    """Regression: ``load_trace`` on a FIFO blocked forever in ``open()`` (no writer). Now it is
    opened non-blocking, ``fstat`` says FIFO, and the error says so."""
    p = _fifo(tmp_path)
    code = (
        "from kinetoscope.trace import TraceError, load_trace, load_traces, parse_trace, load_trace_reference\n"
        f"try:\n    {call}\n    print('LOADED')\nexcept TraceError as e:\n    print('ERR', e)\n"
    )
    out = _in_child(code, p)
    assert "ERR" in out and "FIFO" in out and "not a regular file" in out, out


def test_a_device_is_refused_before_reading(tmp_path):
    with pytest.raises(TraceError, match="character device, not a regular file"):
        parse_trace("/dev/zero", workers=0)


def test_kscope_analyze_on_a_fifo_is_one_line(tmp_path):
    p = _fifo(tmp_path)
    code = (
        "import runpy, sys\nsys.argv = ['kscope', 'analyze', P, '--no-cache']\n"
        "runpy.run_module('kinetoscope.cli.main', run_name='__main__')\n"
    )
    out = _in_child(code, p)
    assert "FIFO" in out and "Traceback" not in out, out


# ---- events of a gzip file --------------------------------------------------------------------
def _event_bomb(tmp_path: Path, n: int) -> Path:
    import gzip

    p = tmp_path / "bomb.json.gz"
    with gzip.open(p, "wb", compresslevel=9) as fh:
        fh.write(b'{"traceEvents":[' + EV)
        block = (b"," + EV) * 10_000
        for _ in range(n // 10_000):
            fh.write(block)
        fh.write(b"]}")
    return p


def test_a_gzip_bomb_of_valid_events_stops_at_the_density_limit(tmp_path):
    """Regression: 10.9 MB of gzip inflating to 40.8 M valid events loaded to 5 GB RSS (the
    byte limit, 16 GiB of JSON, was never reached). Now a gzip file holds at most
    ``max(GZIP_EVENTS_FLOOR, max_gzip_events_per_mib x MiB)`` events; tests scale the floor
    away and use a small density so a few hundred thousand events suffice."""
    from kinetoscope.trace import limits as L

    p = _event_bomb(tmp_path, 300_000)
    size = p.stat().st_size
    assert size < 200_000  # ~100 events per compressed byte: a bomb
    lim = Limits(max_gzip_events_per_mib=64 << 10)  # 64 Ki per MiB
    cap = max(L.GZIP_EVENTS_FLOOR, (size * lim.max_gzip_events_per_mib) >> 20)
    assert cap == L.GZIP_EVENTS_FLOOR  # the floor admits 2 Mi events: lower it for the test
    import unittest.mock as mock

    with mock.patch.object(L, "GZIP_EVENTS_FLOOR", 100_000):
        with pytest.raises(TraceError) as info:
            parse_trace(p, workers=0, limits=lim)
    msg = str(info.value)
    assert "more than 100000 events" in msg and "KSCOPE_MAX_GZIP_EVENTS_PER_MIB" in msg, msg
    assert "--max-trace-events" in msg
    # the same file is fine with the default density (300 k events < the 2 Mi floor)
    assert parse_trace(p, workers=0).events.height == 300_001


def test_the_absolute_event_limit_names_its_flag(tmp_path):
    p = tmp_path / "plain.json"
    p.write_bytes(doc(b",".join([EV] * 5000)))
    with pytest.raises(
        TraceError,
        match=r"more than 1000 events: over the limit of 1000 events per file "
        r"\(KSCOPE_MAX_TRACE_EVENTS / kscope --max-trace-events\)",
    ):
        parse_trace(p, workers=0, limits=Limits(max_events=1000), chunk_bytes=4 * KIB)


def test_cli_max_trace_events(tmp_path):
    """``kscope --max-trace-events N`` sets the limit for the command (one line, no traceback)."""
    import subprocess
    import sys

    from tests.report.kscope_testkit import env_with_repo

    p = tmp_path / "plain.json"
    p.write_bytes(doc(b",".join([EV] * 5000)))

    def kscope(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "kinetoscope.cli.main", *args],
            env=env_with_repo(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    r = kscope("--max-trace-events", "1000", "analyze", str(p), "--no-cache")
    assert r.returncode != 0 and "KSCOPE_MAX_TRACE_EVENTS" in r.stderr and "Traceback" not in r.stderr
    r = kscope("--max-trace-events", "many", "analyze", str(p))
    assert r.returncode == 2 and "not a size" in r.stderr
