"""Parquet cache: hits skip parsing, keys follow content (not mtime), corrupt entries rebuild."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kinetoscope.trace import TraceCache, default_cache_dir, load_trace, loader
from kinetoscope.trace import cache as cache_mod
from tests.trace.conftest import assert_same_trace

SRC = "critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"


@pytest.fixture()
def parses(monkeypatch):
    """Counts real parses (cache misses) through loader.parse_trace."""
    calls = []
    real = loader.parse_trace

    def counting(*a, **kw):
        calls.append(a[0])
        return real(*a, **kw)

    monkeypatch.setattr(loader, "parse_trace", counting)
    return calls


def entries(root: Path) -> list[Path]:
    return [e for sub in root.iterdir() if sub.is_dir() for e in sub.iterdir() if not e.name.startswith(".")]


def test_second_load_hits_cache(trace_copy, parses, _isolated_cache):
    p = trace_copy(SRC)
    hits = cache_mod.STATS["hit"]
    a = load_trace(p)
    b = load_trace(p)
    assert len(parses) == 1
    assert cache_mod.STATS["hit"] == hits + 1
    assert_same_trace(a, b)
    assert b.meta.path == str(p) and b.meta.rank == 0
    e = entries(_isolated_cache)
    assert len(e) == 1
    assert sorted(f.name for f in e[0].iterdir()) == sorted(
        [f"{n}.parquet" for n in ("events", "flows", "counters", "instants", "processes", "threads")]
        + ["meta.json"]
    )


def test_cache_false_always_parses_and_writes_nothing(trace_copy, parses, _isolated_cache):
    p = trace_copy(SRC)
    load_trace(p, cache=False)
    load_trace(p, cache=False)
    assert len(parses) == 2
    assert entries(_isolated_cache) == [] if _isolated_cache.exists() else True


def test_kscope_cache_dir_moves_it(trace_copy, tmp_path, monkeypatch, parses):
    d = tmp_path / "elsewhere"
    monkeypatch.setenv("KSCOPE_CACHE_DIR", str(d))
    assert default_cache_dir() == d
    p = trace_copy(SRC)
    load_trace(p)
    assert len(entries(d)) == 1
    load_trace(p)
    assert len(parses) == 1


def test_default_dir_follows_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.delenv("KSCOPE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "kinetoscope"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "kinetoscope"


def test_explicit_cache_dir_argument(trace_copy, tmp_path, parses):
    p = trace_copy(SRC)
    load_trace(p, cache_dir=tmp_path / "c")
    load_trace(p, cache_dir=tmp_path / "c")
    assert len(parses) == 1 and len(entries(tmp_path / "c")) == 1


@pytest.mark.parametrize("damage", ["truncate-parquet", "garbage-meta", "delete-table", "empty-dir"])
def test_corrupt_entry_is_ignored_and_rebuilt(trace_copy, parses, _isolated_cache, damage):
    p = trace_copy(SRC)
    want = load_trace(p)
    (entry,) = entries(_isolated_cache)
    if damage == "truncate-parquet":
        f = entry / "events.parquet"
        f.write_bytes(f.read_bytes()[:100])
    elif damage == "garbage-meta":
        (entry / "meta.json").write_text("{nope")
    elif damage == "delete-table":
        (entry / "flows.parquet").unlink()
    else:
        for f in entry.iterdir():
            f.unlink()
    corrupt = cache_mod.STATS["corrupt"]
    got = load_trace(p)
    assert cache_mod.STATS["corrupt"] == corrupt + 1
    assert len(parses) == 2
    assert_same_trace(got, want)
    got2 = load_trace(p)  # rebuilt entry is good again
    assert len(parses) == 2
    assert_same_trace(got2, want)


def test_content_change_invalidates_even_with_same_mtime_and_size(tmp_path, parses):
    from tests.trace.conftest import write_doc

    doc = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "aaaa", "ts": 1, "dur": 2}]}
    p = write_doc(tmp_path / "rank-1.json", doc)
    st = p.stat()
    assert load_trace(p).events["name"].to_list() == ["aaaa"]
    doc["traceEvents"][0]["name"] = "bbbb"
    write_doc(p, doc)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert p.stat().st_size == st.st_size and p.stat().st_mtime_ns == st.st_mtime_ns
    assert load_trace(p).events["name"].to_list() == ["bbbb"]
    assert len(parses) == 2


def test_loader_version_is_part_of_the_key(trace_copy, monkeypatch, parses):
    p = trace_copy(SRC)
    load_trace(p)
    monkeypatch.setattr(cache_mod, "LOADER_VERSION", cache_mod.LOADER_VERSION + 1)
    load_trace(p)
    assert len(parses) == 2


def test_same_bytes_elsewhere_get_their_own_rank(tmp_path, hta_traces, parses):
    src = hta_traces / "distributed_info_unavailable" / "distributed_info_not_found.json.gz"
    a = tmp_path / "rank-3.json.gz"
    b = tmp_path / "worker5.json.gz"
    shutil.copyfile(src, a)
    shutil.copyfile(src, b)
    ta, tb = load_trace(a), load_trace(b)
    assert len(parses) == 1  # same content: parsed once
    assert (ta.meta.rank, ta.meta.rank_source) == (3, "filename")
    assert (tb.meta.rank, tb.meta.rank_source) == (5, "filename")
    assert tb.meta.path == str(b)
    assert not any("rank unknown" in w for w in tb.meta.warnings)


def test_unwritable_cache_dir_still_loads(trace_copy, tmp_path, monkeypatch):
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("x")
    monkeypatch.setenv("KSCOPE_CACHE_DIR", str(blocker / "sub"))
    t = load_trace(trace_copy(SRC))
    assert len(t.events) == 868


def test_clear_and_size(trace_copy, _isolated_cache):
    load_trace(trace_copy(SRC))
    c = TraceCache()
    assert c.size_bytes() > 0
    assert c.clear() == 1
    assert entries(_isolated_cache) == []


def test_prune_removes_least_recently_used(tmp_path, hta_traces, monkeypatch):
    import time

    root = tmp_path / "c"
    srcs = [
        "trace_compare/base/base.json.gz",
        "trace_compare/test/test.json.gz",
        "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    ]
    paths = []
    for i, s in enumerate(srcs):
        p = tmp_path / f"f{i}.json.gz"
        shutil.copyfile(hta_traces / s, p)
        paths.append(p)
        load_trace(p, cache_dir=root)
        time.sleep(0.02)
    c = TraceCache(root)
    load_trace(paths[0], cache_dir=root)  # most recently used now
    sizes = {e: sum(f.stat().st_size for f in e.iterdir()) for e in c.entries()}
    keep = max(sizes.values()) + 1
    removed = c.prune(keep)
    assert removed == 2 and len(c.entries()) == 1
    hits = cache_mod.STATS["hit"]
    load_trace(paths[0], cache_dir=root)
    assert cache_mod.STATS["hit"] == hits + 1  # the recently used entry survived


def test_auto_prune_respects_env(tmp_path, trace_copy, monkeypatch):
    monkeypatch.setenv("KSCOPE_CACHE_MAX_BYTES", "1")
    root = tmp_path / "c"
    load_trace(trace_copy(SRC), cache_dir=root)
    assert TraceCache(root).entries() == []  # pruned right after the write
    assert (root / ".pruned").exists()
