"""Keep a loaded trace's tables compact: one contiguous buffer per column, freed memory given back.

Terms: a table is *chunked* when its columns are lists of per-chunk arrays (the loader links
one frame per ~4 MiB chunk of JSON without copying them). Polars' eager operations on a chunked
frame (``DataFrame.filter`` in particular) first make every column contiguous, i.e. copy the
whole table for the duration of the call: on a 1.1M-row trace each eager filter of the events
table cost ~260 MB of transient memory (docs/performance.md, "Memory design"). Making the
columns contiguous once, one column at a time, costs one column of transient memory instead.

*Giving memory back*: the native decoder's buffers come from the C allocator, and the chunks it
frees sit in its heap (counted in the process's RSS) until ``malloc_trim`` returns them to the
system; glibc only trims the top of its heap by itself. :func:`release_free_memory` does that
(a no-op where the C library has no ``malloc_trim``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache
from typing import Any

import polars as pl


@cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None (musl, macOS, Windows)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None)
    except OSError:
        return None


def release_free_memory() -> None:
    """Return the C heap's free pages to the system (module docstring)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def contiguous(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with each chunked column made contiguous, one column at a time (module docstring).

    The caller must hold no other reference to ``df`` (or to the frames it was concatenated
    from) for the old chunks to be freed as each column is replaced. Values, dtypes and column
    order are unchanged; a column already in one chunk (including a constant column Polars
    keeps unexpanded, such as an all-null one) is left as it is."""
    chunked = [name for name, n in zip(df.columns, df.n_chunks("all"), strict=True) if n > 1]
    for name in chunked:
        df = df.with_columns(df.get_column(name).rechunk())
        release_free_memory()
    return df
