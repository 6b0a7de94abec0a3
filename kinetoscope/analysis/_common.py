"""Helpers shared by the analysis modules (not public API; import from the modules instead).

Conventions every analysis follows:

* Input: one ``Trace`` or a sequence of them (one per rank). Tables follow
  ``kinetoscope.trace.schema``: integer **nanosecond** times, nulls for missing values.
* Output: one Polars DataFrame with a ``rank`` column (nullable Int64: null when the loader could
  not learn the rank). Durations are reported in **microseconds** (Float64) like HTA, under HTA's
  column names where HTA has one.
* No per-row Python: everything is Polars expressions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar, cast

import polars as pl

from kinetoscope.analysis.intervals import ENGINE
from kinetoscope.analysis.kernel_types import kernel_type_expr
from kinetoscope.analysis.reads import CORE_READS as CORE_READS
from kinetoscope.analysis.reads import DEVICE_COLUMNS as DEVICE_COLUMNS
from kinetoscope.trace.model import Trace
from kinetoscope.trace.schema import DEVICE_KINDS, RUNTIME_KINDS

NS_PER_US = 1000.0

TraceInput = Trace | Sequence[Trace]
_T = TypeVar("_T")


def as_traces(traces: TraceInput | Iterable[Trace]) -> list[Trace]:
    """Accept one Trace or any iterable of Traces; always return a list."""
    if isinstance(traces, Trace):
        return [traces]
    out = list(traces)
    for t in out:
        if not isinstance(t, Trace):
            raise TypeError(f"expected Trace objects, got {type(t).__name__}")
    return out


def rank_lit(trace: Trace) -> pl.Expr:
    """The trace's rank as a nullable Int64 literal column named ``rank``."""
    return pl.lit(trace.meta.rank, dtype=pl.Int64).alias("rank")


def to_us(expr: pl.Expr | str) -> pl.Expr:
    """ns (integer) -> µs (float)."""
    col = pl.col(expr) if isinstance(expr, str) else expr
    return col.cast(pl.Float64) / NS_PER_US


def classify(df: pl.DataFrame, name_col: str = "name", out: str = "kernel_type") -> pl.DataFrame:
    """Add the kernel type (see ``kernel_types``) by classifying each distinct name once."""
    if df.is_empty():
        return df.with_columns(pl.lit(None, dtype=pl.String).alias(out))
    names = df.select(pl.col(name_col).unique()).with_columns(kernel_type_expr(name_col).alias(out))
    return df.join(names, on=name_col, how="left", nulls_equal=True, maintain_order="left")


def memo(trace: Trace, key: str, build: Callable[[], _T]) -> _T:
    """Per-trace memo of a derived table, valid while ``trace.events`` is the same object (so
    several analyses in one run share e.g. the classified device events). Stored on the
    instance; never part of the Trace's data."""
    store = trace.__dict__.setdefault("_kscope_memo", {})
    hit = store.get(key)
    if hit is not None and hit[0] is trace.events:
        return cast(_T, hit[1])
    value = build()
    store[key] = (trace.events, value)
    return value


def forget_memos(trace: Trace) -> None:
    """Drop the derived tables :func:`memo` keeps on ``trace`` (the device frame, launch pairs,
    ...: ~0.25x the events table on a GPU trace), e.g. once the analyses that share them are done."""
    trace.__dict__.pop("_kscope_memo", None)


def device_frame(trace: Trace) -> pl.DataFrame:
    """Device events (kernels, memcpy, memset, MTIA device events that carry a stream) with
    ``end = ts + dur`` and ``kernel_type``. ``cuda_sync`` rows are not included (see docs).
    Same rows as ``trace.device_events()``, only the columns in ``DEVICE_COLUMNS``, sorted by
    ``ts, end, idx`` (so later sorts by time are cheap)."""

    def build() -> pl.DataFrame:
        ev = trace.events
        cols = [c for c in DEVICE_COLUMNS if c in ev.columns]
        dev = (
            ev.lazy()
            .select(cols)
            .filter(pl.col("kind").is_in(list(DEVICE_KINDS)) & pl.col("stream").is_not_null())
            .with_columns((pl.col("ts") + pl.col("dur")).alias("end"))
            .sort("ts", "end", "idx")
            .collect(engine=ENGINE)
        )
        return classify(dev)

    return memo(trace, "device_frame", build)


def launch_times(trace: Trace) -> pl.DataFrame:
    """``correlation -> launch_ts``: start of the host runtime call with that correlation."""

    def build() -> pl.DataFrame:
        return (
            trace.events.lazy()
            .select("kind", "correlation", "ts")
            .filter(pl.col("kind").is_in(list(RUNTIME_KINDS)) & pl.col("correlation").is_not_null())
            .group_by("correlation")
            .agg(pl.col("ts").min().alias("launch_ts"))
            .collect(engine=ENGINE)
        )

    return memo(trace, "launch_times", build)


def concat_or_empty(frames: list[pl.DataFrame], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Vertical concat that tolerates an empty list and keeps a stable schema."""
    frames = [f.select(list(schema)).cast(schema) for f in frames if f.height]  # type: ignore[arg-type]
    if not frames:
        return pl.DataFrame(schema=schema)
    return pl.concat(frames, how="vertical")


RankBuilder = Callable[[Trace], "pl.DataFrame | None"]


def per_rank_frames(traces: TraceInput | Iterable[Trace], build: RankBuilder) -> list[pl.DataFrame]:
    """``build(trace)`` for each trace, in order, keeping the frames that have rows.

    ``build`` gives one rank's rows (with its ``rank`` column, see :func:`rank_lit`); ``None``
    or an empty frame means nothing for that rank."""
    frames = (build(t) for t in as_traces(traces))
    return [f for f in frames if f is not None and f.height]


def per_rank(
    traces: TraceInput | Iterable[Trace], build: RankBuilder, schema: dict[str, pl.DataType]
) -> pl.DataFrame:
    """The per-rank-then-concat loop of every multi-rank analysis: :func:`per_rank_frames`
    concatenated in trace order with ``schema``'s columns and dtypes (:func:`concat_or_empty`:
    an empty result when no rank has rows)."""
    return concat_or_empty(per_rank_frames(traces, build), schema)


def describe_aggs(col: str, *, prefix: str = "") -> list[pl.Expr]:
    """pandas ``describe()`` over ``col``: count, mean, std, min, 25%, 50%, 75%, max.

    Quantiles use linear interpolation, as pandas does.
    """
    c = pl.col(col).cast(pl.Float64)
    return [
        c.count().cast(pl.Int64).alias(f"{prefix}count"),
        c.mean().alias(f"{prefix}mean"),
        c.std().alias(f"{prefix}std"),
        c.min().alias(f"{prefix}min"),
        c.quantile(0.25, "linear").alias(f"{prefix}25%"),
        c.quantile(0.5, "linear").alias(f"{prefix}50%"),
        c.quantile(0.75, "linear").alias(f"{prefix}75%"),
        c.max().alias(f"{prefix}max"),
    ]


DESCRIBE_COLUMNS = ("count", "mean", "std", "min", "25%", "50%", "75%", "max")


def describe_schema(prefix: str = "") -> dict[str, pl.DataType]:
    return {f"{prefix}{c}": (pl.Int64() if c == "count" else pl.Float64()) for c in DESCRIBE_COLUMNS}
