"""In-memory model of one loaded trace: typed tables plus metadata.

A ``Trace`` is what every analysis takes. Tables follow ``kinetoscope.trace.schema``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from kinetoscope.trace.schema import DEVICE_KINDS, RUNTIME_KINDS, empty_table


@dataclass
class TraceMeta:
    """Who and what a trace is about. ``rank_source`` says how ``rank`` was learned, so that a
    guessed rank is never mistaken for a recorded one."""

    path: str
    rank: int | None = None
    world_size: int | None = None
    rank_source: str = "unknown"  # "distributedInfo" | "manifest" | "filename" | "unknown"
    hostname: str | None = None
    job_id: str | None = None
    pid: int | None = None
    cmdline: str | None = None
    trace_id: str | None = None
    device_type: str = "UNKNOWN"  # "NVIDIA GPU" | "AMD GPU" | "MTIA" | "CPU" | "UNKNOWN GPU" | "UNKNOWN"
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    distributed_info: dict[str, Any] = field(default_factory=dict)
    base_time_ns: int | None = None
    schema_version: int | None = None
    num_trace_events: int = 0
    # non-numeric pid/tid strings (e.g. "Spans", "Traces") -> the negative id used in tables
    labels: dict[str, int] = field(default_factory=dict)
    # every other top-level key of the file (username, cupti_version, ...)
    extra: dict[str, Any] = field(default_factory=dict)
    # problems noticed while loading that did not stop it (salvaged events, odd fields)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "rank": self.rank,
            "world_size": self.world_size,
            "rank_source": self.rank_source,
            "hostname": self.hostname,
            "job_id": self.job_id,
            "pid": self.pid,
            "trace_id": self.trace_id,
            "device_type": self.device_type,
            "num_trace_events": self.num_trace_events,
            "warnings": list(self.warnings),
        }


@dataclass
class Trace:
    """One rank's trace as typed Polars tables (see ``kinetoscope.trace.schema``)."""

    meta: TraceMeta
    events: pl.DataFrame = field(default_factory=lambda: empty_table("events"))
    flows: pl.DataFrame = field(default_factory=lambda: empty_table("flows"))
    counters: pl.DataFrame = field(default_factory=lambda: empty_table("counters"))
    instants: pl.DataFrame = field(default_factory=lambda: empty_table("instants"))
    processes: pl.DataFrame = field(default_factory=lambda: empty_table("processes"))
    threads: pl.DataFrame = field(default_factory=lambda: empty_table("threads"))

    @property
    def rank(self) -> int | None:
        return self.meta.rank

    @property
    def path(self) -> str:
        return self.meta.path

    # ---- common views -------------------------------------------------------------------
    def device_events(self) -> pl.DataFrame:
        """Kernels, memcpy, memset (and MTIA device events) that carry a stream."""
        return self.events.filter(pl.col("kind").is_in(list(DEVICE_KINDS)) & pl.col("stream").is_not_null())

    def kernels(self) -> pl.DataFrame:
        return self.events.filter(pl.col("kind") == "kernel")

    def cpu_ops(self) -> pl.DataFrame:
        return self.events.filter(pl.col("kind") == "cpu_op")

    def runtime(self) -> pl.DataFrame:
        """Host-side runtime/driver calls (launches, memcpy calls, syncs)."""
        return self.events.filter(pl.col("kind").is_in(list(RUNTIME_KINDS)))

    def launch_links(self) -> pl.DataFrame:
        """Runtime launch -> device event pairs joined on ``correlation``.

        Columns: correlation, launch_idx, launch_name, launch_ts, launch_dur, launch_tid,
        gpu_idx, gpu_name, gpu_kind, gpu_ts, gpu_dur, stream.
        """
        rt = (
            self.runtime()
            .filter(pl.col("correlation").is_not_null())
            .select(
                "correlation",
                pl.col("idx").alias("launch_idx"),
                pl.col("name").alias("launch_name"),
                pl.col("ts").alias("launch_ts"),
                pl.col("dur").alias("launch_dur"),
                pl.col("tid").alias("launch_tid"),
            )
        )
        dev = (
            self.device_events()
            .filter(pl.col("correlation").is_not_null())
            .select(
                "correlation",
                pl.col("idx").alias("gpu_idx"),
                pl.col("name").alias("gpu_name"),
                pl.col("kind").alias("gpu_kind"),
                pl.col("ts").alias("gpu_ts"),
                pl.col("dur").alias("gpu_dur"),
                "stream",
            )
        )
        return rt.join(dev, on="correlation", how="inner")

    def memory_events(self) -> pl.DataFrame:
        return self.instants.filter(pl.col("name") == "[memory]")

    def span_ns(self) -> tuple[int, int] | None:
        """(first start, last end) over all complete events, or None for an empty trace."""
        if self.events.is_empty():
            return None
        row = self.events.select(
            pl.col("ts").min().alias("a"), (pl.col("ts") + pl.col("dur")).max().alias("b")
        )
        return int(row["a"][0]), int(row["b"][0])
