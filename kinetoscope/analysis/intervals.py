"""Interval algebra on Polars frames with ``ts``/``dur`` (ns): the shared core of the breakdowns."""

from __future__ import annotations

from typing import Final

import polars as pl

# Polars 2's default engine for ``LazyFrame.collect(engine=ENGINE)`` is the streaming one, which is several
# times slower than the in-memory engine on the frame sizes of a trace (sorts in particular).
ENGINE: Final = "in-memory"


def merge_intervals(df: pl.DataFrame, start: str = "ts", dur: str = "dur") -> pl.DataFrame:
    """Union of ``[start, start+dur)`` intervals as disjoint, sorted rows ``start``, ``end``.

    A new group starts when an interval begins strictly after every earlier one has ended
    (touching intervals merge), as in HTA's ``merge_kernel_intervals``.
    """
    if df.is_empty():
        return pl.DataFrame(schema={"start": pl.Int64, "end": pl.Int64})
    return (
        df.lazy()
        .select(pl.col(start).alias("start"), (pl.col(start) + pl.col(dur)).alias("end"))
        .sort("start")
        .with_columns(prev_end=pl.col("end").cum_max().shift(1))
        .with_columns(group=(pl.col("start") > pl.col("prev_end")).fill_null(True).cast(pl.Int64).cum_sum())
        .group_by("group")
        .agg(pl.col("start").min(), pl.col("end").max())
        .sort("start")
        .select("start", "end")
        .collect(engine=ENGINE)
    )


def union_length(df: pl.DataFrame, start: str = "ts", dur: str = "dur") -> int:
    """Total time covered by at least one interval."""
    merged = merge_intervals(df, start, dur)
    if merged.is_empty():
        return 0
    return int((merged["end"] - merged["start"]).sum())


def intersection_length(a: pl.DataFrame, b: pl.DataFrame) -> int:
    """Time covered by both unions ``a`` and ``b`` (each given as merged ``start``/``end`` rows)."""
    if a.is_empty() or b.is_empty():
        return 0
    events = pl.concat(
        [
            a.select(pl.col("start").alias("t"), pl.lit(1).alias("d")),
            a.select(pl.col("end").alias("t"), pl.lit(-1).alias("d")),
            b.select(pl.col("start").alias("t"), pl.lit(2).alias("d")),
            b.select(pl.col("end").alias("t"), pl.lit(-2).alias("d")),
        ]
    ).sort("t", "d")
    sweep = events.with_columns(running=pl.col("d").cum_sum(), next_t=pl.col("t").shift(-1))
    return int(
        sweep.filter(pl.col("running") == 3).select((pl.col("next_t") - pl.col("t")).sum()).item() or 0
    )


# ---- grouped, single-pass primitives (used by the breakdowns) ---------------------------------
#
# All of these take a frame with integer ``ts``/``end`` columns (ns) and optional grouping keys,
# and never loop in Python. Input order does not matter: they sort themselves.


def covered_contribution(df: pl.DataFrame | pl.LazyFrame, keys: list[str] | None = None) -> pl.LazyFrame:
    """Add ``covered``: how much each interval adds to the union of its group.

    After sorting by ``keys, ts``, interval *i* adds ``max(0, end_i - max(ts_i, F))`` where *F*
    is the largest end among earlier intervals of the group. Summing ``covered`` per group gives
    the union length; intervals with ``covered == 0`` are fully hidden by earlier ones.
    Zero-length and negative-length intervals add nothing.
    """
    keys = list(keys or [])
    # Window expressions keep each group's rows in frame order, so sorting by time is enough.
    lf = df.lazy().sort(["ts", "end"])
    frontier = pl.col("end").cum_max().shift(1)
    if keys:
        frontier = frontier.over(keys)
    return lf.with_columns(
        covered=(pl.col("end") - pl.max_horizontal(pl.col("ts"), frontier)).clip(lower_bound=0)
    )


def busy_span(df: pl.DataFrame | pl.LazyFrame, keys: list[str] | None = None) -> pl.DataFrame:
    """Per group: ``first`` (min ts), ``last`` (max end), ``busy`` (union length), ``n``.

    ``span = last - first`` and ``idle = span - busy`` follow HTA's temporal breakdown.
    """
    keys = list(keys or [])
    agg = [
        pl.col("ts").min().alias("first"),
        pl.col("end").max().alias("last"),
        pl.col("covered").sum().alias("busy"),
        pl.len().alias("n"),
    ]
    lf = covered_contribution(df, keys)
    if keys:
        return lf.group_by(keys).agg(agg).collect(engine=ENGINE)
    return lf.select(agg).collect(engine=ENGINE)


def merge_intervals_by(df: pl.DataFrame | pl.LazyFrame, keys: list[str] | None = None) -> pl.LazyFrame:
    """Union of ``[ts, end)`` per group as disjoint rows ``keys..., start, end`` (touching
    intervals merge, like ``merge_intervals``). No group-by: after sorting, a merged interval
    starts at each row that begins after the running maximum end, and ends at the running
    maximum end on the row before the next such start."""
    keys = list(keys or [])
    lf = df.lazy().select([*keys, "ts", "end"]).sort([*keys, "ts", "end"])
    run = pl.col("end").cum_max()
    if keys:
        run = run.over(keys)
    lf = lf.with_columns(_run=run)
    prev = pl.col("_run").shift(1)
    nxt_start = pl.col("ts").shift(-1)
    if keys:
        prev = prev.over(keys)
        nxt_start = nxt_start.over(keys)
    lf = lf.with_columns(
        _first=(pl.col("ts") > prev).fill_null(True),
        _last=(nxt_start > pl.col("_run")).fill_null(True),
    )
    starts = lf.filter(pl.col("_first")).select([*keys, pl.col("ts").alias("start")])
    ends = lf.filter(pl.col("_last")).select(pl.col("_run").alias("end"))
    return pl.concat([starts, ends], how="horizontal")


def covered_pieces(df: pl.DataFrame | pl.LazyFrame, keys: list[str] | None = None) -> pl.LazyFrame:
    """Disjoint pieces whose union per group equals the union of ``[ts, end)``: the part of each
    interval past the running maximum end of the earlier ones (``keys..., start, end``). Cheaper
    than ``merge_intervals_by`` when merged rows are not needed (e.g. for ``sweep_states``)."""
    keys = list(keys or [])
    return (
        covered_contribution(df.lazy().select([*keys, "ts", "end"]), keys)
        .filter(pl.col("covered") > 0)
        .select([*keys, (pl.col("end") - pl.col("covered")).alias("start"), "end"])
    )


def sweep_states(
    merged: pl.DataFrame | pl.LazyFrame, keys: list[str] | None = None, bit_col: str = "bit"
) -> pl.LazyFrame:
    """Sweep line over per-class disjoint intervals (``keys..., bit, start, end``; within one
    class no two intervals overlap, touching is fine). Returns segments ``keys..., state, t,
    next_t`` where ``state`` is the OR (= sum) of the classes active in ``[t, next_t)``.
    Segments of length 0 are dropped, so simultaneous changes net out.
    """
    keys = list(keys or [])
    lf = merged.lazy()
    points = pl.concat(
        [
            lf.select([*keys, pl.col("start").alias("t"), pl.col(bit_col).alias("d")]),
            lf.select([*keys, pl.col("end").alias("t"), (-pl.col(bit_col)).alias("d")]),
        ]
    ).sort([*keys, "t"])
    state = pl.col("d").cum_sum()
    nxt = pl.col("t").shift(-1)
    if keys:
        state = state.over(keys)
        nxt = nxt.over(keys)
    # Among points at the same t only the last has next_t > t: it carries the net state.
    return (
        points.with_columns(state=state, next_t=nxt)
        .filter(pl.col("next_t").is_not_null() & (pl.col("next_t") > pl.col("t")) & (pl.col("state") > 0))
        .select([*keys, "state", "t", "next_t"])
    )
