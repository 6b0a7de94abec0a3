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
from kinetoscope.protocol.structinfo import prime_structs


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
    peak: float | None = None  # the largest share of an observed step it alone costs
    typical: float | None = None  # the median over steps of that share
    tie_cost: float | None = None  # share saved by fixing it with the ranks tied with it, together
    least_late: float | None = None  # the smallest such share in its late steps
    typical_between: float | None = None  # the median such share in its other steps


class WhatIf(Part):
    """``stragglers.whatif``: the replay of the job (docs/diagnosis.md §8). ``slowdown`` is the
    observed step time over the ideal one; ``per_rank``/``per_optype`` the slowdown each rank /
    op type alone explains; ``m_w``/``m_s`` the share of the slowdown recovered by fixing the
    worst 3 % of ranks (worker issues) / by balancing the last pipeline stage (stage
    imbalance; null without stages), the OSDI '25 M_W and M_S; ``explaining_set`` the
    ranks that, fixed, recover ``recovered_fraction`` of the lost time. ``process_groups``: the
    replay joined process groups or pipeline transfers (not only job-wide collectives);
    ``transfers``: the pipeline send/recv pairs it joined with their peers (0: none);
    ``excess_work``: per rank in two process groups or more, its local work above the typical
    peer's, as a share of the job's time, beyond the median rank's (a rank late only by waiting
    for a named one in a group they share has about 0)."""

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
    excess_work: dict[str, float] = msgspec.field(default_factory=dict)


class NextRank(Part):
    """A rank that would hold the job back next (``stragglers.next_ranks``)."""

    rank: int
    imposed_per_step_us: float | None = None
    share_of_step: float | None = None
    last_count: int | None = None


def _us(key: str) -> Any:
    """A µs column whose JSON key is not an identifier (``lost(us)`` -> field ``lost_us``)."""
    return msgspec.field(default=None, name=key)


class StragglerRankRow(Part):
    """One row of ``stragglers.per_rank`` (the producer's columns are
    ``diagnosis.stragglers.model.PER_RANK_SCHEMA``, in its order). ``score``: share of job time
    the others waited for this rank; ``last_count``/``instances``: collectives it arrived last at
    / held; ``imposed_wait_us``/``imposed_share``: the waiting it imposed and its share in the
    round it was named; ``whatif_saving_us``: step time saved had only it arrived like the typical
    rank; ``role``: how the verdict named it (``None``: not named)."""

    rank: int | None = None
    host: str | None = None
    steps: int | None = None
    late_steps: int | None = None
    late_share: float | None = None
    mean_lateness_us: float | None = _us("mean_lateness(us)")
    mean_lateness_frac: float | None = None
    score: float | None = None
    mean_self_time_us: float | None = _us("mean_self_time(us)")
    mean_compute_us: float | None = _us("mean_compute(us)")
    compute_vs_median: float | None = None
    mean_sync_wait_us: float | None = _us("mean_sync_wait(us)")
    mean_dataloader_us: float | None = _us("mean_dataloader(us)")
    instances: int | None = None
    last_count: int | None = None
    p_value: float | None = None
    imposed_wait_us: float | None = _us("imposed_wait(us)")
    imposed_share: float | None = None
    whatif_saving_us: float | None = _us("whatif_saving(us)")
    role: str | None = None
    lost_share: float | None = None


class StragglerStepRow(Part):
    """One row of ``stragglers.per_step`` (the producer's columns are
    ``diagnosis.stragglers.model.PER_STEP_SCHEMA``, in its order): the step's time, the waiting
    lost in it, the excess the late ranks caused and the step time without it, the event
    thresholds, the rank most waited for, the late ranks and how many collectives it held."""

    step: int | None = None
    step_time_us: float | None = _us("step_time(us)")
    lost_us: float | None = _us("lost(us)")
    excess_us: float | None = _us("excess(us)")
    est_step_time_us: float | None = _us("est_step_time(us)")
    threshold_us: float | None = _us("threshold(us)")
    persistent_threshold_us: float | None = _us("persistent_threshold(us)")
    last_rank: int | None = None
    max_lateness_us: float | None = _us("max_lateness(us)")
    late_ranks: list[int] = msgspec.field(default_factory=list)
    n_instances: int | None = None
    max_imposed_us: float | None = _us("max_imposed(us)")


class Stragglers(Part):
    """The ``stragglers`` part as the views read it. ``per_rank`` and ``per_step`` are typed
    rows; a table view shows them with ``msgspec.to_builtins`` (the producer's columns)."""

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
    per_rank: list[StragglerRankRow] = msgspec.field(default_factory=list)
    per_step: list[StragglerStepRow] = msgspec.field(default_factory=list)
    whatif: WhatIf | None = None

    def per_rank_by_score(self) -> list[StragglerRankRow]:
        """``per_rank`` rows, highest straggler ``score`` first (rows without one last)."""
        return sorted(self.per_rank, key=lambda r: -(r.score or 0.0))


prime_structs(globals())
