"""Timestamp anomalies of one trace: times that cannot be true, counted and located.

Why: a verdict computed from corrupted times is confidently wrong. Profiling one process again
and again (what ``kscope autopilot`` does) is known to shift kernel timestamps at the start of
each later profiling run (PyTorch issues #192021 and #175790): device work then appears to start
**before the host launched it**. The diagnosis reads these counts (``evidence.py``) to name the
anomaly, leave the affected steps out of the verdict where enough steps remain, and lower its
confidence otherwise. The autopilot can read ``TimestampAnomalies.total`` per sample.

Terms (per trace, one clock, no cross-rank alignment involved):

``device_before_launch``
    device events (kernels, memcpy, memset) whose start is more than ``TOLERANCE_NS`` before the
    start of the runtime call that launched them (joined on ``correlation``). The queue time
    (device start - launch start) of such an event is negative.
``negative_durations``
    complete events with ``dur < 0``.
``unlaunched_device``
    device events whose launch is not in the trace: launched before the window started. HTA's
    queue-length analysis counts them as a negative queue; they are a window edge, not a
    corruption, so they are counted but not held against the verdict.
``steps``
    the rank's local step numbers (``analysis.steps.detect_steps``) holding a ``device_before_launch``
    or ``negative_durations`` event (a launch's step, else the event's own).
"""

from __future__ import annotations

import msgspec
import polars as pl

from kinetoscope.protocol.structinfo import prime_structs
from kinetoscope.trace.model import Trace
from kinetoscope.trace.schema import DEVICE_KINDS, RUNTIME_KINDS

# A device start this far before its launch is a corruption, not rounding (CUPTI and the host
# clock are converted to one time base at microsecond resolution).
TOLERANCE_NS = 1_000


class TimestampAnomalies(msgspec.Struct, kw_only=True):
    """The timestamp anomalies of one trace (module docstring defines each count)."""

    device_before_launch: int = 0
    worst_before_launch_us: float | None = None  # the largest lead of a device start over its launch
    negative_durations: int = 0
    unlaunched_device: int = 0
    steps: list[int] = []

    @property
    def total(self) -> int:
        """The anomalies held against a verdict (``unlaunched_device`` is a window edge)."""
        return self.device_before_launch + self.negative_durations


def timestamp_anomalies(trace: Trace, steps: pl.DataFrame | None = None) -> TimestampAnomalies:
    """Count the anomalies of ``trace``; ``steps`` (``detect_steps``: step, start, end) locates
    them in local steps (detected here when not given)."""
    ev = trace.events
    if ev.is_empty():
        return TimestampAnomalies()
    neg = ev.filter(pl.col("dur") < 0).select("ts")
    dev = ev.filter(pl.col("kind").is_in(list(DEVICE_KINDS)) & pl.col("correlation").is_not_null())
    rt = ev.filter(pl.col("kind").is_in(list(RUNTIME_KINDS)) & pl.col("correlation").is_not_null())
    linked = dev.select("correlation", pl.col("ts").alias("gpu_ts")).join(
        rt.select("correlation", pl.col("ts").alias("launch_ts")).unique("correlation", keep="first"),
        on="correlation",
        how="left",
    )
    early = linked.filter(
        pl.col("launch_ts").is_not_null() & (pl.col("gpu_ts") < pl.col("launch_ts") - TOLERANCE_NS)
    )
    unlaunched = int(linked["launch_ts"].null_count())
    worst = None
    if early.height:
        worst = float((early["launch_ts"] - early["gpu_ts"]).max()) / 1000.0
    where = pl.concat([early.select(pl.col("launch_ts").alias("ts")), neg])
    return TimestampAnomalies(
        device_before_launch=early.height,
        worst_before_launch_us=worst,
        negative_durations=neg.height,
        unlaunched_device=unlaunched,
        steps=_steps_of(trace, where, steps) if where.height else [],
    )


def _steps_of(trace: Trace, where: pl.DataFrame, steps: pl.DataFrame | None) -> list[int]:
    """The local steps whose window holds one of the times in ``where["ts"]``."""
    if steps is None:
        from kinetoscope.analysis.steps import detect_steps

        steps = detect_steps(trace)
    if steps.is_empty():
        return []
    hit = (
        where.join_where(
            steps.select("step", "start", "end"),
            pl.col("ts") >= pl.col("start"),
            pl.col("ts") < pl.col("end"),
        )["step"]
        .unique()
        .sort()
    )
    return [int(s) for s in hit.to_list()]


prime_structs(globals())
