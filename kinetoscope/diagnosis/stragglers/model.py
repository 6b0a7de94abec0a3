"""The straggler verdict's data: its thresholds, its per-rank and per-step table schemas, and the
report with its JSON form (``docs/diagnosis.md`` §5 and §8 define every field)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from kinetoscope.analysis.runner import frame_rows


@dataclass(frozen=True)
class StragglerThresholds:
    """Every threshold of the straggler verdict (docs/diagnosis-stragglers.md)."""

    k_sigma: float = 8.0
    rel_step: float = 0.05
    rel_step_intermittent: float = 0.15
    rel_step_candidate: float = 0.25
    persistent_noise_cap: float = 1.0
    rel_to_worst: float = 0.5
    abs_floor_us: float = 100.0
    min_lost_fraction: float = 0.015
    min_jitter_lost_fraction: float = 0.05
    min_intermittent_lost_fraction: float = 0.05
    min_events: int = 2
    persistent_share: float = 0.5
    recurrent_concentration: float = 0.6
    min_steps_confident: int = 4
    alpha: float = 0.02
    steady_alpha: float = 0.005
    min_rank_effect: float = 0.01
    min_share: float = 0.2
    tie_us: float = 0.5
    spike_factor: float = 4.0
    max_named: int = 8
    link_floor_us: float = 5.0
    link_min_ranks: int = 3
    link_min_effect: float = 0.015
    ring_note_fraction: float = 0.15
    min_event_share: float = 0.5


PER_RANK_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "host": pl.String(),
    "steps": pl.Int64(),
    "late_steps": pl.Int64(),
    "late_share": pl.Float64(),
    "mean_lateness(us)": pl.Float64(),
    "mean_lateness_frac": pl.Float64(),
    "score": pl.Float64(),
    "mean_self_time(us)": pl.Float64(),
    "mean_compute(us)": pl.Float64(),
    "compute_vs_median": pl.Float64(),
    "mean_sync_wait(us)": pl.Float64(),
    "mean_dataloader(us)": pl.Float64(),
    "instances": pl.Int64(),
    "last_count": pl.Int64(),
    "p_value": pl.Float64(),
    "imposed_wait(us)": pl.Float64(),
    "imposed_share": pl.Float64(),
    "whatif_saving(us)": pl.Float64(),
    "role": pl.String(),
    "lost_share": pl.Float64(),
}


PER_STEP_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "step_time(us)": pl.Float64(),
    "lost(us)": pl.Float64(),
    "excess(us)": pl.Float64(),
    "est_step_time(us)": pl.Float64(),
    "threshold(us)": pl.Float64(),
    "persistent_threshold(us)": pl.Float64(),
    "last_rank": pl.Int64(),
    "max_lateness(us)": pl.Float64(),
    "late_ranks": pl.List(pl.Int64()),
    "n_instances": pl.Int64(),
    "max_imposed(us)": pl.Float64(),
}


@dataclass
class StragglerReport:
    kind: str = "none"  # persistent | intermittent | mixed | rotating | none
    ranks: list[int] = field(default_factory=list)
    hosts: dict[int, str | None] = field(default_factory=dict)
    recurrent_ranks: list[int] = field(default_factory=list)
    intermittent_ranks: list[int] = field(default_factory=list)
    lost_fraction: float | None = None
    skew_fraction: float | None = None
    transfer_fraction: float | None = None
    transfer_spread: float | None = None
    mean_step_time_us: float | None = None
    est_step_time_us: float | None = None
    sigma_us: float | None = None
    steps_analysed: int = 0
    straggled_steps: int = 0
    dropped_steps: int = 0
    instances: int = 0
    partial_instances: int = 0
    confidence: str = "n/a"
    pattern: str | None = None
    reason: str = ""
    cause: str | None = None
    causes: dict[int, dict[str, Any]] = field(default_factory=dict)
    next_ranks: list[dict[str, Any]] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)  # ranks named as late together
    steady: dict[int, dict[str, Any]] = field(default_factory=dict)  # steady lateness of named ranks
    total_imposed_us: float = 0.0
    per_rank: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=PER_RANK_SCHEMA))
    per_step: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=PER_STEP_SCHEMA))
    thresholds: StragglerThresholds = field(default_factory=StragglerThresholds)
    whatif: dict[str, Any] | None = None  # stragglers.replay_report.WhatIfReport.to_dict()
    replay_error: str | None = None  # why the job could not be replayed (then ``whatif`` is None)

    def rank_row(self, r: int) -> dict[str, Any]:
        """The per-rank row of rank ``r`` (empty dict when absent)."""
        rows = self.per_rank.filter(pl.col("rank") == r)
        return rows.row(0, named=True) if rows.height else {}

    def per_rank_column(self, c: str) -> dict[str, Any]:
        """Column ``c`` of ``per_rank`` keyed by the rank as text (empty without rows)."""
        pr = self.per_rank
        return dict(zip(map(str, pr["rank"].to_list()), pr[c].to_list(), strict=True)) if pr.height else {}

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``docs/diagnosis.md`` §8)."""
        speedup = None
        if self.mean_step_time_us and self.est_step_time_us:
            speedup = self.mean_step_time_us / self.est_step_time_us
        col = self.per_rank_column
        th = self.thresholds
        return {
            "kind": self.kind,
            "ranks": list(self.ranks),
            "hosts": {str(r): h for r, h in self.hosts.items()},
            "recurrent_ranks": list(self.recurrent_ranks),
            "intermittent_ranks": list(self.intermittent_ranks),
            "pattern": self.pattern,
            "confidence": self.confidence,
            "reason": self.reason,
            "cause": self.cause,
            "causes": {str(r): c for r, c in self.causes.items()},
            "lost_fraction": self.lost_fraction,
            "skew_fraction": self.skew_fraction,
            "transfer_fraction": self.transfer_fraction,
            "transfer_spread": self.transfer_spread,
            "what_if": {
                "mean_step_time_us": self.mean_step_time_us,
                "est_step_time_without_stragglers_us": self.est_step_time_us,
                "speedup": speedup,
            },
            "next_ranks": list(self.next_ranks),
            "groups": list(self.groups),
            "steady": {str(r): v for r, v in self.steady.items()},
            "imposed_wait": col("imposed_wait(us)"),
            "p_value": col("p_value"),
            "per_instance": {
                "instances": self.instances,
                "partial_instances_dropped": self.partial_instances,
                "total_imposed_us": self.total_imposed_us,
                "last_counts": col("last_count"),
            },
            "steps_analysed": self.steps_analysed,
            "dropped_steps": self.dropped_steps,
            "straggled_steps": self.straggled_steps,
            "noise_sigma_us": self.sigma_us,
            # first_step_factor: a retired rule's key, kept for readers of the contract (always 1.0)
            "thresholds": {"first_step_factor": 1.0, **{k: getattr(th, k) for k in th.__dataclass_fields__}},
            "per_rank": frame_rows(self.per_rank),
            "per_step": frame_rows(self.per_step),
            "whatif": self.whatif,
        }
