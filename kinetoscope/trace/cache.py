"""Parquet cache of loaded traces, keyed by the file's content.

A second analysis of the same file reads the typed tables back instead of parsing JSON again.

* Key: XXH3-128 of the file's bytes as stored (the compressed bytes for ``.json.gz``; BLAKE2b
  when ``xxhash`` is missing) + the size + :data:`LOADER_VERSION` + a fingerprint of the table
  schemas + the salvage flag. Size and mtime alone are never trusted: editing a file in place
  and restoring its mtime still invalidates.
* Location: ``$KSCOPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/kinetoscope``, else
  ``~/.cache/kinetoscope``; one directory per entry (``<key[:2]>/<key>/``) holding one Parquet
  file per table and ``meta.json`` (the content part of ``TraceMeta``; rank and other
  location-derived fields are recomputed on every load because the same bytes may be a
  different rank elsewhere).
* Writes are atomic: the entry is written to a temporary directory and renamed into place. An
  entry that cannot be read back (truncated, wrong schema, not Parquet) is ignored, removed and
  rebuilt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any, Final

import msgspec
import polars as pl

from kinetoscope.trace.compact import contiguous
from kinetoscope.trace.model import Trace, TraceMeta
from kinetoscope.trace.schema import TABLE_SCHEMAS

_xxhash: ModuleType | None
try:  # pragma: no cover - exercised implicitly
    import xxhash as _xxhash
except ImportError:  # pragma: no cover
    _xxhash = None

# Bump when the tables a given file produces change (parsing rules, schema, coercions).
LOADER_VERSION = 3  # 2: exact decimal timestamps, cuda_profiler_range counters; 3: negative dur -> 0
HASH_READ = 4 << 20
PARQUET_COMPRESSION: Final = "snappy"

# Observability for tests and ``kscope`` diagnostics: hits, misses, writes, corrupt entries.
STATS: Counter[str] = Counter()
# Least-recently-used entries are removed past this size ($KSCOPE_CACHE_MAX_BYTES; 0 = never).
DEFAULT_MAX_BYTES = 20 << 30
PRUNE_EVERY_S = 3600.0


def _schema_fingerprint() -> str:
    text = repr(sorted((t, sorted((c, str(d)) for c, d in s.items())) for t, s in TABLE_SCHEMAS.items()))
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


SCHEMA_FINGERPRINT = _schema_fingerprint()


def default_cache_dir() -> Path:
    env = os.environ.get("KSCOPE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "kinetoscope"
    return Path.home() / ".cache" / "kinetoscope"


def file_digest(path: str) -> str | None:
    """Content hash of a file (None if it cannot be read: the parser will report why)."""
    h = _xxhash.xxh3_128() if _xxhash is not None else hashlib.blake2b(digest_size=16)
    try:
        with open(path, "rb") as fh:
            size = 0
            while True:
                block = fh.read(HASH_READ)
                if not block:
                    break
                size += len(block)
                h.update(block)
    except OSError:
        return None
    return f"{h.hexdigest()}-{size}"


def _meta_to_json(meta: TraceMeta) -> bytes:
    return msgspec.json.encode(dataclasses.asdict(meta))


def _meta_from_json(data: bytes) -> TraceMeta:
    raw = msgspec.json.decode(data)
    if not isinstance(raw, dict):
        raise ValueError("meta.json is not an object")
    names = {f.name for f in dataclasses.fields(TraceMeta)}
    return TraceMeta(**{k: v for k, v in raw.items() if k in names})


class TraceCache:
    """A directory of cached traces. Cheap to construct; no I/O until used."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()

    def key_for(self, path: str, *, salvage: bool = False) -> str | None:
        digest = file_digest(path)
        if digest is None:
            return None
        mode = "s" if salvage else "n"
        return f"v{LOADER_VERSION}-{SCHEMA_FINGERPRINT}-{mode}-{digest}"

    def entry_dir(self, key: str) -> Path:
        return self.root / key.split("-")[3][:2] / key

    def get(self, key: str) -> Trace | None:
        d = self.entry_dir(key)
        if not d.is_dir():
            STATS["miss"] += 1
            return None
        try:
            meta = _meta_from_json((d / "meta.json").read_bytes())
            tables: dict[str, pl.DataFrame] = {}
            for name, schema in TABLE_SCHEMAS.items():
                # row groups come back as chunks: one buffer per column (trace.compact)
                df = contiguous(pl.read_parquet(d / f"{name}.parquet"))
                if list(df.columns) != list(schema):
                    raise ValueError(f"{name}: unexpected columns")
                if dict(df.schema) != schema:
                    df = df.cast(schema)  # type: ignore[arg-type]  # polars' stub: Mapping keys invariant (Enum stored as String)
                tables[name] = df
        except Exception:  # noqa: BLE001 - any unreadable entry is rebuilt
            STATS["corrupt"] += 1
            shutil.rmtree(d, ignore_errors=True)
            return None
        STATS["hit"] += 1
        try:
            os.utime(d)  # recency for LRU pruning
        except OSError:
            pass
        return Trace(meta=meta, **tables)

    def put(self, key: str, trace: Trace) -> Path | None:
        """Store ``trace`` (content meta only); returns the entry directory, or None if the
        cache directory is not writable (caching is best effort)."""
        final = self.entry_dir(key)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[-12:]}-", dir=final.parent))
        except OSError:
            return None
        try:
            for name in TABLE_SCHEMAS:
                df: pl.DataFrame = getattr(trace, name)
                # one row group: a hit reads back one chunk per column (trace.compact)
                df.write_parquet(
                    tmp / f"{name}.parquet",
                    compression=PARQUET_COMPRESSION,
                    statistics=False,
                    row_group_size=max(df.height, 1),
                )
            (tmp / "meta.json").write_bytes(_meta_to_json(trace.meta))
            try:
                os.rename(tmp, final)
            except OSError:  # another process stored it first (or a stale entry exists)
                if final.is_dir():
                    shutil.rmtree(tmp, ignore_errors=True)
                    return final
                raise
        except Exception:  # noqa: BLE001 - the cache must never break a load
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        STATS["write"] += 1
        self._maybe_prune()
        return final

    def entries(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [
            e
            for sub in self.root.iterdir()
            if sub.is_dir() and len(sub.name) == 2
            for e in sub.iterdir()
            if e.is_dir() and not e.name.startswith(".")
        ]

    def prune(self, max_bytes: int) -> int:
        """Remove least recently used entries until the cache holds at most ``max_bytes``.
        Returns how many entries were removed."""
        sized = []
        for e in self.entries():
            try:
                size = sum(f.stat().st_size for f in e.iterdir())
                sized.append((e.stat().st_mtime, size, e))
            except OSError:
                continue
        total = sum(s for _, s, _ in sized)
        removed = 0
        for _, size, e in sorted(sized):
            if total <= max_bytes:
                break
            shutil.rmtree(e, ignore_errors=True)
            total -= size
            removed += 1
        return removed

    def _maybe_prune(self) -> None:
        """Prune to $KSCOPE_CACHE_MAX_BYTES at most once an hour (a stamp file records when)."""
        try:
            limit = int(os.environ.get("KSCOPE_CACHE_MAX_BYTES", DEFAULT_MAX_BYTES))
        except ValueError:
            limit = DEFAULT_MAX_BYTES
        if limit <= 0:
            return
        stamp = self.root / ".pruned"
        try:
            import time

            if stamp.exists() and time.time() - stamp.stat().st_mtime < PRUNE_EVERY_S:
                return
            stamp.touch()
            self.prune(limit)
        except OSError:
            pass

    def clear(self) -> int:
        """Remove every entry; returns how many were removed."""
        n = 0
        if not self.root.is_dir():
            return 0
        for sub in self.root.iterdir():
            if sub.is_dir() and len(sub.name) == 2:
                for entry in sub.iterdir():
                    shutil.rmtree(entry, ignore_errors=True)
                    n += 1
        return n

    def size_bytes(self) -> int:
        total = 0
        for p in self.root.rglob("*"):
            try:
                if p.is_file():
                    total += p.stat().st_size
            except OSError:
                pass
        return total


def cached_trace_meta(meta: TraceMeta) -> dict[str, Any]:
    """The JSON-ready content meta as stored in the cache (for debugging)."""
    content: dict[str, Any] = msgspec.json.decode(_meta_to_json(meta))
    return content
