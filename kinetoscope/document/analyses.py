"""Typed rows of the analysis tables the views draw charts from (HTA's column names; durations
in µs). Every table is also kept as its row objects (``AnalysisDocument.tables``) for display:
these Structs name only the columns a chart or a summary reads."""

from __future__ import annotations

import msgspec

from kinetoscope.document.parts import Part
from kinetoscope.protocol.structinfo import prime_structs


class TemporalRow(Part):
    """``temporal_breakdown`` (per rank) and ``temporal_breakdown_by_step`` (per rank and step)."""

    rank: int | None = None
    step: int | None = None
    idle_time_us: float | None = msgspec.field(default=None, name="idle_time(us)")
    compute_time_us: float | None = msgspec.field(default=None, name="compute_time(us)")
    non_compute_time_us: float | None = msgspec.field(default=None, name="non_compute_time(us)")
    idle_time_pctg: float | None = None
    compute_time_pctg: float | None = None
    non_compute_time_pctg: float | None = None


class StepDurationRow(Part):
    """``step_durations``: one rank's one step."""

    rank: int | None = None
    step: int | None = None
    duration_us: float | None = msgspec.field(default=None, name="duration(us)")


class IdleRow(Part):
    """``idle_time_breakdown``: idle time of one rank's stream in one category (µs)."""

    rank: int | None = None
    stream: int | None = None
    idle_category: str | None = None
    idle_time: float | None = None
    idle_time_ratio: float | None = None


class KernelTypeRow(Part):
    """``kernel_type_breakdown``: GPU time of one kernel type on one rank (µs)."""

    rank: int | None = None
    kernel_type: str | None = None
    sum: float | None = None


class KernelRow(Part):
    """``kernel_breakdown`` / ``kernel_distribution``: one kernel on one rank (µs)."""

    rank: int | None = None
    name: str | None = None
    kernel_type: str | None = None
    sum_us: float | None = msgspec.field(default=None, name="sum (us)")
    count: float | None = None


class OverlapRow(Part):
    """``comm_comp_overlap``: communication time and its share overlapped by compute (µs)."""

    rank: int | None = None
    communication_time_us: float | None = msgspec.field(default=None, name="communication_time(us)")
    overlap_time_us: float | None = msgspec.field(default=None, name="overlap_time(us)")
    comp_comm_overlap_pctg: float | None = None


prime_structs(globals())
