"""The read form of the ``stragglers`` part (docs/diagnosis.md §8).

The straggler verdict is produced by ``kinetoscope.diagnosis.stragglers.verdict`` (its JSON form is
``StragglerReport.to_dict``); this is how the views read it. ``kind`` is a plain string
(``none``, ``persistent``, ``intermittent``, ``rotating``, ``mixed``, ``not_assessed``, ...): a
new kind reads through unchanged. Unknown keys are ignored, so the producer may add fields
without touching this module; rank-keyed maps have string keys as in the JSON.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kinetoscope.document.parts import Part


class LegacyWhatIf(Part):
    """``stragglers.what_if``: the mean step time now and without the named ranks' lateness (µs)."""

    mean_step_time_us: float | None = None
    est_step_time_without_stragglers_us: float | None = None
    speedup: float | None = None


class ExplainingRank(Part):
    """One rank of the replay's explaining set (``whatif.explaining_set``)."""

    rank: int
    cost: float | None = None  # share of observed step time saved by fixing it
    own_cost: float | None = None  # its slowdown when it alone is observed, minus 1
    late_steps: list[int] = msgspec.field(default_factory=list)
    kind: str | None = None


class WhatIf(Part):
    """``stragglers.whatif``: the replay of the job (docs/diagnosis.md §8). ``slowdown`` is the
    observed step time over the ideal one; ``per_rank``/``per_optype`` the slowdown each rank /
    op type alone explains; ``m_w``/``m_s`` the waiting and skew margins; ``explaining_set`` the
    ranks that, fixed, recover ``recovered_fraction`` of the lost time. ``process_groups``: the
    replay joined process groups or pipeline transfers (not only job-wide collectives);
    ``transfers``: the pipeline send/recv pairs it joined with their peers (0: none)."""

    slowdown: float | None = None
    per_rank: dict[str, float] = msgspec.field(default_factory=dict)
    per_optype: dict[str, float] = msgspec.field(default_factory=dict)
    m_w: float | None = None
    m_s: float | None = None
    explaining_set: list[ExplainingRank] = msgspec.field(default_factory=list)
    recovered_fraction: float | None = None
    kind: str | None = None
    lost_fraction: float | None = None
    process_groups: bool = False
    transfers: int = 0


class NextRank(Part):
    """A rank that would hold the job back next (``stragglers.next_ranks``)."""

    rank: int
    imposed_per_step_us: float | None = None
    share_of_step: float | None = None
    last_count: int | None = None


class Stragglers(Part):
    """The ``stragglers`` part as the views read it. ``per_rank`` and ``per_step`` stay row
    objects: they are shown as tables with whatever columns the producer wrote."""

    kind: str | None = None
    ranks: list[int] = msgspec.field(default_factory=list)
    hosts: dict[str, str | None] = msgspec.field(default_factory=dict)
    pattern: str | None = None
    confidence: str | None = None
    reason: str | None = None
    cause: str | None = None
    causes: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    lost_fraction: float | None = None
    skew_fraction: float | None = None
    what_if: LegacyWhatIf | None = None
    next_ranks: list[NextRank] = msgspec.field(default_factory=list)
    steps_analysed: int | None = None
    dropped_steps: int | None = None
    straggled_steps: int | None = None
    noise_sigma_us: float | None = None
    per_rank: list[dict[str, Any]] = msgspec.field(default_factory=list)
    per_step: list[dict[str, Any]] = msgspec.field(default_factory=list)
    whatif: WhatIf | None = None

    def per_rank_by_score(self) -> list[dict[str, Any]]:
        """``per_rank`` rows, highest straggler ``score`` first (rows without one last)."""

        def score(row: dict[str, Any]) -> float:
            v = row["score"] if "score" in row else None
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0

        return sorted(self.per_rank, key=lambda r: -score(r))
