"""Keep a loaded trace's tables compact: one contiguous buffer per column, repeated strings
stored once, freed memory given back, and only the tables and columns a caller reads.

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
from collections.abc import Collection, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from kinetoscope.trace.model import Trace


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
        col = df.get_column(name)
        df = df.with_columns(shared_strings(col) if col.dtype == pl.String else col.rechunk())
        del col
        release_free_memory()
    return df


def shared_strings(s: pl.Series) -> pl.Series:
    """``s`` (String) contiguous, each distinct value's bytes stored once.

    Polars stores a string column as one 16-byte view per row plus the bytes of every string
    longer than 12 bytes, once per row: a trace's kernel and op names (a few hundred distinct
    values, often 50-200 bytes each) took 5x their views' size. A gather from the distinct
    values copies only the views, which then point at the distinct values' bytes: the same
    values, a fraction of the memory (81 -> 18 MB for the names of a 1.1M-event trace). Left
    as it is (only made contiguous) when most values are distinct, where sharing saves little."""
    uniq: pl.Series = s.unique().rechunk()
    if uniq.len() * 2 > s.len():
        whole: pl.Series = s.rechunk()
        return whole
    codes = (
        s.to_frame("v")
        .join(
            uniq.to_frame("v").with_row_index("_i"),
            on="v",
            how="left",
            nulls_equal=True,
            maintain_order="left",
        )
        .get_column("_i")
    )
    shared: pl.Series = uniq.gather(codes).rename(s.name)
    return shared


# ---- projection: build only the tables and columns the caller will read ---------------------
# ``Columns`` maps a table name ("events", "flows", "counters", "instants") to the columns to
# keep; a table not named is not kept at all (it is left with no columns, so that reading it
# fails loudly instead of looking empty). ``processes`` and ``threads`` (a few rows) are always
# kept whole.
Columns = Mapping[str, Collection[str]]
PROJECTED_TABLES = ("events", "flows", "counters", "instants")
# What the loader itself reads of the events once they are built (the metadata's kinds and
# runtime names, the negative-duration warning): always kept.
LOADER_COLUMNS = ("idx", "kind", "name", "dur")


def kept_columns(name: str, columns: Columns | None) -> list[str] | None:
    """The columns of table ``name`` to keep, in schema order; None when the table is dropped."""
    from kinetoscope.trace.schema import TABLE_SCHEMAS

    schema = TABLE_SCHEMAS[name]
    if columns is None or name not in PROJECTED_TABLES:
        return list(schema)
    keep = columns.get(name)
    if keep is None:
        return None
    wanted = set(keep) | (set(LOADER_COLUMNS) if name == "events" else set())
    unknown = wanted - set(schema)
    if unknown:
        raise ValueError(f"table {name} has no column(s) {sorted(unknown)}")
    return [c for c in schema if c in wanted]


def project(trace: Trace, columns: Columns | None) -> Trace:
    """``trace`` with only the kept tables and columns (in place; see ``Columns``). Selecting
    columns copies nothing: the dropped ones are freed once nothing else holds them."""
    if columns is None:
        return trace
    for name in PROJECTED_TABLES:
        keep = kept_columns(name, columns)
        table = getattr(trace, name)
        setattr(trace, name, pl.DataFrame() if keep is None else table.select(keep))
    release_free_memory()
    return trace
