"""The optional native decoder: one chunk of ``traceEvents`` -> Polars frames, in C.

The C extension (``_decoder.c``, built by ``pip install`` when a C compiler is present)
scans a chunk (``[`` events ``]``, as cut by :class:`kinetoscope.trace.decode.EventStream`)
and writes the table columns straight into Arrow buffers, which Polars imports through the
Arrow PyCapsule interface: no Python object per event. It implements the loader's rules for
the common case only and gives up on anything else (a syntax error, an odd type, a value out
of range, ...); the chunk is then decoded by the Python path, which stays the specification
and produces every error and warning. ``KSCOPE_NATIVE=0`` turns the native path off.

Terms: a *fallback* is a chunk the native decoder gave up on; ``STATS`` counts chunks by
outcome (``native``, ``fallback``) so tests can check which path ran.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

_decoder: Any
try:  # absent when the package was installed without a C compiler
    from kinetoscope.trace._native import _decoder
except ImportError:  # pragma: no cover - depends on the build
    _decoder = None

STATS: Counter[str] = Counter()
_configured = False
_ARG_NAMES: tuple[str, ...] = ()


def available() -> bool:
    """The extension is built and importable."""
    return _decoder is not None


def enabled() -> bool:
    """The native path is used: built, and not turned off with ``KSCOPE_NATIVE=0``."""
    return _decoder is not None and os.environ.get("KSCOPE_NATIVE", "1").strip() not in (
        "0",
        "false",
        "no",
        "off",
    )


def configure() -> None:
    """Configure the extension now, if not done yet (before threads decode: ``configure``
    rewrites the keys table that a running ``decode_chunk`` reads)."""
    if not _configured:
        _configure()


def _configure() -> None:
    """Give the extension the args keys -> columns map of the schema (one source of truth)."""
    global _configured, _ARG_NAMES
    import polars as pl

    from kinetoscope.trace.schema import ARG_COLUMNS

    names: list[str] = []
    keys = []
    for key, (col, dtype) in ARG_COLUMNS.items():
        if col not in names:
            names.append(col)
        kind = (
            _decoder.I64 if dtype == pl.Int64() else _decoder.F64 if dtype == pl.Float64() else _decoder.STR
        )
        keys.append((key, names.index(col), kind))
    _decoder.configure(keys, len(names))
    _ARG_NAMES = tuple(names)
    _configured = True


@dataclass
class NativeChunk:
    """A chunk's frames (chunk-local ``idx`` and pid/tid labels), in the shape of
    :class:`kinetoscope.trace.parallel.BuiltChunk` so that ``TableBuilder.add_built`` links it."""

    n_events: int
    frames: dict[str, Any]
    labels: list[tuple[str, int]]
    out_of_range: int = 0
    warn: dict[str, int] = field(default_factory=dict)
    slow: int = 0
    exact: int = 0
    first_index: int = 0
    end: int | None = None  # relative: where the top-level text continues after the array
    # (EventStream's chunk bookkeeping; a native chunk is never decoded again)
    source: Any = "native"
    lo: int = 0
    hi: int = 0
    patch: int | None = None

    @property
    def events(self) -> range:
        """Stands in for the decoded event list where only its length is used."""
        return range(self.n_events)


def decode(data: Any) -> NativeChunk | None:
    """Decode one chunk (``[`` events ``]`` and possibly the top-level text after the array)
    into frames, or None when the Python path must decode it (see the module docstring)."""
    if not _configured:
        _configure()
    got = _decoder.decode_chunk(data)
    if got[0] is None:  # (None, why, offset): the Python path decides
        STATS["fallback"] += 1
        return None
    n, end, tables, labels = got
    STATS["native"] += 1
    return NativeChunk(n_events=n, frames=_frames(tables), labels=labels, end=None if end < 0 else end)


def _frames(tables: dict[str, Any]) -> dict[str, Any]:
    import polars as pl

    args = tables.pop("args", [])
    frames = {}
    for name, cols in tables.items():
        data = {col_name: pl.Series(col) for col_name, col in cols.items()}
        if name == "events":
            data.update((_ARG_NAMES[i], pl.Series(col)) for i, col in args)
        frames[name] = pl.DataFrame(data)
    return frames
