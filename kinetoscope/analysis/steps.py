"""Training-step detection and assignment of events to steps.

Definition
----------
A *step* of one rank is a half-open host-time window ``[start, end)`` (ns, the trace's own
clock), found in this order:

1. **ProfilerStep** (``source = "ProfilerStep"``): host-side events (``cpu_op`` /
   ``user_annotation``) named ``ProfilerStep#N``. Step number ``N``; ``start`` = earliest start,
   ``end`` = latest end of the events with that number (one per thread normally).
   **Every** step is kept, including the last one. (HTA drops the last ProfilerStep and all
   kernels launched in it at load time, HTA issue #76; we don't.)
2. **Optimizer step** (``source = "optimizer"``), used when there is no ProfilerStep, as in
   on-demand traces: host annotations named ``Optimizer.step#<Class>.step``. One step is the
   interval between consecutive optimizer-step *ends*; the first step starts at the start of the
   trace (the earliest host event). Steps are numbered 0, 1, 2, ... in time order. Whatever
   follows the last optimizer step is an incomplete step and is not a step. When several
   optimizer classes step in the same iteration (e.g. a sparse and a dense optimizer), only the
   most frequent name (ties: the one that finishes last) delimits steps.
3. Otherwise the rank has no steps (an empty frame for it).

Assigning events to steps (``assign_steps``): a host event belongs to the step whose window
contains its ``ts``. A device event (kernel, memcpy, memset) belongs to the step in which it was
*launched* (the ``ts`` of the runtime call with the same ``correlation``), like HTA's
``iteration`` column; a device event without a launch in the trace falls back to its own ``ts``.
Events outside every window get a null step.

API
---
* ``detect_steps(traces) -> DataFrame[rank, step, start, end, source]`` (ns, Int64)
* ``assign_steps(trace, events=None, steps=None) -> events + step``
* ``step_durations(traces) -> DataFrame[rank, step, source, start(us), end(us), duration(us)]``
"""

from __future__ import annotations

import polars as pl

from kinetoscope.analysis._common import CORE_READS, TraceInput, launch_times, memo, per_rank, rank_lit, to_us
from kinetoscope.analysis.intervals import ENGINE
from kinetoscope.analysis.registry import AnalysisSpec, register
from kinetoscope.trace.model import Trace
from kinetoscope.trace.schema import DEVICE_KINDS

PROFILER_STEP_PATTERN = r"^ProfilerStep\s*#\s*(\d+)"
OPTIMIZER_STEP_PATTERN = r"^Optimizer\.step#"
HOST_ANNOTATION_KINDS = ("cpu_op", "user_annotation")

STEPS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "step": pl.Int64(),
    "start": pl.Int64(),
    "end": pl.Int64(),
    "source": pl.String(),
}

STEP_DURATIONS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "step": pl.Int64(),
    "source": pl.String(),
    "start(us)": pl.Float64(),
    "end(us)": pl.Float64(),
    "duration(us)": pl.Float64(),
}


def _host_annotations(trace: Trace) -> pl.DataFrame:
    """Host ``cpu_op``/``user_annotation`` events that can delimit steps (cheap prefix test
    first; the regexes then run on a handful of rows)."""
    return (
        trace.events.lazy()
        .select("kind", "name", "ts", "dur")
        .filter(pl.col("kind").is_in(HOST_ANNOTATION_KINDS))
        .filter(
            pl.col("name").str.starts_with("ProfilerStep") | pl.col("name").str.starts_with("Optimizer.step#")
        )
        .select("name", "ts", "dur")
        .collect(engine=ENGINE)
    )


def _profiler_steps(ann: pl.DataFrame) -> pl.DataFrame:
    return (
        ann.filter(pl.col("name").str.contains(PROFILER_STEP_PATTERN))
        .with_columns(step=pl.col("name").str.extract(PROFILER_STEP_PATTERN, 1).cast(pl.Int64))
        .group_by("step")
        .agg(pl.col("ts").min().alias("start"), (pl.col("ts") + pl.col("dur")).max().alias("end"))
        .sort("start", "step")
        .with_columns(source=pl.lit("ProfilerStep"))
    )


def _trace_start(trace: Trace) -> int | None:
    ev = trace.events.select("kind", "ts")
    host = ev.filter(~pl.col("kind").is_in(list(DEVICE_KINDS)))
    src = host if host.height else ev
    if src.is_empty():
        return None
    return int(src["ts"].min())  # type: ignore[arg-type]


def _optimizer_steps(trace: Trace, ann: pl.DataFrame) -> pl.DataFrame:
    opt = ann.filter(pl.col("name").str.contains(OPTIMIZER_STEP_PATTERN)).with_columns(
        end=pl.col("ts") + pl.col("dur")
    )
    if opt.is_empty():
        return pl.DataFrame(schema={k: v for k, v in STEPS_SCHEMA.items() if k != "rank"})
    # One delimiting optimizer: the most frequent name, ties -> the one finishing last.
    pick = (
        opt.group_by("name")
        .agg(pl.len().alias("n"), pl.col("end").max().alias("last"))
        .sort(["n", "last", "name"], descending=[True, True, False])
        .item(0, "name")
    )
    ends = opt.filter(pl.col("name") == pick).select(pl.col("end").unique().sort())
    start0 = _trace_start(trace)
    first_end = int(ends.item(0, "end"))
    if start0 is None or start0 > first_end:
        start0 = int(opt.filter(pl.col("name") == pick)["ts"].min())  # type: ignore[arg-type]
    return ends.with_columns(
        start=pl.col("end").shift(1).fill_null(start0),
        step=pl.int_range(pl.len(), dtype=pl.Int64),
        source=pl.lit("optimizer"),
    ).select("step", "start", "end", "source")


def detect_steps(traces: TraceInput) -> pl.DataFrame:
    """Steps of every trace: ``rank, step, start, end, source`` (ns; see module docstring)."""
    steps = per_rank(traces, lambda t: memo(t, "steps", lambda: _detect(t)), STEPS_SCHEMA)
    return steps.sort("rank", "start", nulls_last=True)


def _detect(t: Trace) -> pl.DataFrame:
    ann = _host_annotations(t)
    steps = _profiler_steps(ann)
    if steps.is_empty():
        steps = _optimizer_steps(t, ann)
    return steps.with_columns(rank_lit(t))


def _launch_times(trace: Trace) -> pl.DataFrame:
    """correlation -> ts of the runtime call that launched it."""
    return launch_times(trace).rename({"launch_ts": "_launch_ts"})


def assign_steps(
    trace: Trace,
    events: pl.DataFrame | None = None,
    steps: pl.DataFrame | None = None,
    *,
    by_launch: bool = True,
) -> pl.DataFrame:
    """Return ``events`` (default: all of ``trace.events``) with a nullable Int64 ``step``
    column, in the same row order. ``steps`` defaults to ``detect_steps(trace)``; only rows of
    this trace's rank are used when it has a ``rank`` column. Device events are placed by their
    launch time when ``by_launch`` (see module docstring)."""
    ev = trace.events if events is None else events
    if steps is None:
        steps = detect_steps(trace)
    elif "rank" in steps.columns:
        r = trace.meta.rank
        steps = steps.filter(pl.col("rank").is_null() if r is None else (pl.col("rank") == r))
    if ev.is_empty() or steps.is_empty():
        return ev.with_columns(pl.lit(None, dtype=pl.Int64).alias("step"))

    work = ev.with_row_index("_row")
    key = pl.col("ts")
    if by_launch and {"kind", "correlation"} <= set(ev.columns):
        work = work.join(_launch_times(trace), on="correlation", how="left")
        key = (
            pl.when(pl.col("kind").is_in(list(DEVICE_KINDS)) & pl.col("_launch_ts").is_not_null())
            .then(pl.col("_launch_ts"))
            .otherwise(pl.col("ts"))
        )
    work = work.with_columns(_key=key).sort("_key")
    win = steps.select(
        pl.col("start").alias("_key"), pl.col("end").alias("_step_end"), pl.col("step").alias("_step")
    ).sort("_key")
    placed = work.join_asof(win, on="_key", strategy="backward")
    placed = placed.with_columns(
        step=pl.when(pl.col("_key") < pl.col("_step_end")).then(pl.col("_step")).otherwise(None)
    )
    drop = [c for c in ("_launch_ts", "_key", "_step_end", "_step") if c in placed.columns]
    return placed.sort("_row").drop([*drop, "_row"])


def step_durations(traces: TraceInput) -> pl.DataFrame:
    """Per rank and step: ``rank, step, source, start(us), end(us), duration(us)``.

    ``start``/``end`` are the trace's own clock in µs (as written in the file)."""
    steps = detect_steps(traces)
    return steps.select(
        "rank",
        "step",
        "source",
        to_us("start").alias("start(us)"),
        to_us("end").alias("end(us)"),
        to_us(pl.col("end") - pl.col("start")).alias("duration(us)"),
    ).cast(STEP_DURATIONS_SCHEMA)  # type: ignore[arg-type]


register(
    AnalysisSpec(
        name="step_durations",
        func=step_durations,
        combine="concat_by_rank",
        reads=CORE_READS,
        description="Training steps per rank (ProfilerStep#N, else optimizer steps) and their durations.",
        needs_gpu=False,
        order=5,
        group="steps",
        empty_note="no steps found (no ProfilerStep#N or Optimizer.step annotations)",
    )
)
