"""Fixtures for the trace-loader tests: an isolated cache, file writers, table comparison."""

from __future__ import annotations

import dataclasses
import gzip
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest

from kinetoscope.trace import Trace, TraceError, parse_trace
from kinetoscope.trace.schema import TABLE_SCHEMAS

TABLES = tuple(TABLE_SCHEMAS)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Never write to ~/.cache during tests."""
    d = tmp_path_factory.mktemp("kscope-cache")
    monkeypatch.setenv("KSCOPE_CACHE_DIR", str(d))
    return d


def write_doc(
    path: Path, doc: Any = None, *, raw: bytes | None = None, gz: bool = False, indent: bool = True
) -> Path:
    """Write a trace document (or raw bytes) as .json or .json.gz."""
    if raw is None:
        raw = orjson.dumps(doc, option=orjson.OPT_INDENT_2 if indent else 0)
    if gz:
        raw = gzip.compress(raw, 1)
    path.write_bytes(raw)
    return path


def assert_same_trace(a: Trace, b: Trace, *, meta: bool = True) -> None:
    for name in TABLES:
        x, y = getattr(a, name), getattr(b, name)
        assert x.schema == y.schema, f"{name}: schema differs"
        assert x.shape == y.shape, f"{name}: shape {x.shape} != {y.shape}"
        if not x.equals(y):
            diff = [c for c in x.columns if not x[c].equals(y[c])]
            raise AssertionError(f"{name}: columns differ: {diff}")
    if meta:
        ma, mb = dataclasses.asdict(a.meta), dataclasses.asdict(b.meta)
        assert ma == mb


def table_digest(df: pl.DataFrame) -> dict[str, Any]:
    """Order-sensitive digest of a table (stable for a pinned Polars version)."""
    h = df.with_row_index("__row").hash_rows(seed=11)
    return {
        "schema": [[c, str(t)] for c, t in df.schema.items()],
        "rows": len(df),
        "h1": int((h % 1_000_000_007).sum()),
        "h2": int((h % 998_244_353).cast(pl.Int64).sum()),
        "nulls": [int(v) for v in df.null_count().row(0)],
    }


def trace_digest(t: Trace) -> dict[str, Any]:
    meta = dataclasses.asdict(t.meta)
    meta.pop("path")
    return {
        "tables": {name: table_digest(getattr(t, name)) for name in TABLES},
        "meta": orjson.loads(orjson.dumps(meta, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)),
    }


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``slow`` tests here (reference loader on the big corpus files, minutes) run only with
    ``-m slow`` or ``KSCOPE_SLOW=1``."""
    import os

    if os.environ.get("KSCOPE_SLOW") == "1" or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow or KSCOPE_SLOW=1")
    here = Path(__file__).parent
    for item in items:
        if "slow" in item.keywords and here in Path(str(item.fspath)).parents:
            item.add_marker(skip)


_PARSED: dict[str, Trace] = {}


def parsed(path: Path) -> Trace:
    """parse_trace(path), memoised for the session (the big corpus files are used by several
    tests; callers must not mutate the result)."""
    key = str(path)
    if key not in _PARSED:
        from kinetoscope.trace import parse_trace

        _PARSED[key] = parse_trace(path)
    return _PARSED[key]


def parse_both(p: Path, workers: int | None, **kw: Any) -> list[Any]:
    """(with ``workers``, serial) results of ``parse_trace``; TraceErrors are returned, not raised."""
    out: list[Any] = []
    for w in (workers, 0):
        try:
            out.append(parse_trace(p, workers=w, **kw))
        except TraceError as e:
            out.append(e)
    return out


def assert_same_as_serial(p: Path, workers: int | None, **kw: Any) -> Any:
    """The parse with ``workers`` gives the serial parse's tables, or its error (message, byte
    offset, event, field); returns the serial result."""
    other, ser = parse_both(p, workers, **kw)
    if isinstance(ser, TraceError):
        assert isinstance(other, TraceError), f"serial failed ({ser}), workers={workers} did not"
        assert (str(other), other.offset, other.event_index, other.field) == (
            str(ser),
            ser.offset,
            ser.event_index,
            ser.field,
        )
        return ser
    assert not isinstance(other, TraceError), other
    assert_same_trace(other, ser)
    return ser
