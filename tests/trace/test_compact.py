"""A trace parsed in many chunks comes out with one contiguous buffer per column (an eager
filter of a chunked table copies the whole table first; docs/performance.md "Memory design"),
with the same values as the reference loader."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from kinetoscope.trace import load_trace_reference, parse_trace
from kinetoscope.trace.compact import contiguous, release_free_memory
from tests.trace.conftest import assert_same_trace

HTA = Path(__file__).resolve().parents[1] / "data" / "traces" / "hta"


def _a_trace() -> Path:
    found = sorted(HTA.glob("**/*.json*"), key=lambda p: p.stat().st_size)
    return next(p for p in found if p.stat().st_size > 200_000)


def test_tables_of_a_many_chunk_parse_are_contiguous() -> None:
    path = _a_trace()
    got = parse_trace(path, chunk_bytes=16_384, workers=0)
    assert got.events.height > 1000  # many chunks of 16 KiB
    for name in ("events", "flows"):
        counts = getattr(got, name).n_chunks("all")
        assert set(counts) == {1}, f"{name}: chunks per column {counts}"
    assert_same_trace(got, load_trace_reference(path), meta=False)


def test_contiguous_keeps_values_dtypes_and_order() -> None:
    a = pl.DataFrame(
        {"x": [1, 2], "s": ["a", None], "n": [None, None]},
        schema={"x": pl.Int64, "s": pl.String, "n": pl.Int64},
    )
    b = pl.DataFrame({"x": [3], "s": ["ccccccccccccccccccccc"], "n": [None]}, schema=a.schema)
    linked = pl.concat([a, b], rechunk=False)
    assert max(linked.n_chunks("all")) == 2
    out = contiguous(linked.clone())
    assert out.n_chunks("all") == [1, 1, 1]
    assert out.schema == linked.schema
    assert out.equals(linked)
    release_free_memory()  # callable everywhere (a no-op without glibc)


def test_a_cached_trace_is_contiguous(tmp_path: Path) -> None:
    """Parquet row groups come back as chunks; the cache hit gives one buffer per column."""
    from kinetoscope.trace import load_trace
    from kinetoscope.trace.cache import TraceCache

    path = _a_trace()
    first = load_trace(path, cache=True, cache_dir=tmp_path)
    key = TraceCache(tmp_path).key_for(str(path))
    assert key is not None
    events = TraceCache(tmp_path).entry_dir(key) / "events.parquet"
    first.events.write_parquet(events, row_group_size=500, statistics=False)
    assert max(pl.read_parquet(events).n_chunks("all")) > 1  # row groups -> chunks
    hit = TraceCache(tmp_path).get(key)
    assert hit is not None
    assert set(hit.events.n_chunks("all")) == {1}
    assert hit.events.equals(first.events)


def test_shared_strings_keeps_values_and_shares_bytes() -> None:
    """Repeated long names: the same values (nulls included), contiguous; a column of mostly
    distinct values is only made contiguous."""
    from kinetoscope.trace.compact import shared_strings

    names = [
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
        None,
        "short",
    ]
    a = pl.Series("name", names * 300, dtype=pl.String)
    b = pl.Series("name", [names[0], "x" * 40] * 200, dtype=pl.String)
    s = pl.concat([a, b], rechunk=False)
    assert s.n_chunks() == 2
    got = shared_strings(s)
    assert got.name == "name" and got.dtype == pl.String and got.n_chunks() == 1
    assert got.equals(s, null_equal=True)
    distinct = pl.Series("d", [f"a distinct value number {i:06d}" for i in range(1000)])
    kept = shared_strings(pl.concat([distinct[:500], distinct[500:]], rechunk=False))
    assert kept.n_chunks() == 1 and kept.equals(distinct)


def test_the_cache_writes_one_row_group_per_table(tmp_path: Path) -> None:
    """More rows than Polars' default row group (512^2): still one chunk when read back."""
    import dataclasses

    from kinetoscope.trace import load_trace
    from kinetoscope.trace.cache import TraceCache

    small = load_trace(_a_trace(), cache=False)
    reps = 300_000 // small.events.height + 1
    big = dataclasses.replace(small, events=pl.concat([small.events] * reps))
    assert big.events.height > 512**2
    store = TraceCache(tmp_path)
    entry = store.put("v1-x-n-abcdef", big)
    assert entry is not None
    assert set(pl.read_parquet(entry / "events.parquet").n_chunks("all")) == {1}
    hit = store.get("v1-x-n-abcdef")
    assert hit is not None and hit.events.equals(big.events)
