"""The replay's report, ``stragglers.whatif``: the job replayed, and replayed again with ranks fixed.

The job is replayed over its collective instances (``whatif.kineto``), then replayed again with
chosen ranks working like the typical peer (``whatif.search``); what the report changes in the
verdict is ``stragglers.reconcile``. Figures (JSON contract in ``docs/diagnosis.md``,
"What-if verdict"):

``slowdown``
    ``T_obs / T_ideal``: observed mean step time over the replay with every rank's local work
    at the typical peer's (median over the members of each collective).
``per_rank``
    ``S_w`` of each candidate rank: ``T_add / T_ideal`` with only that rank's work observed.
``per_optype``
    ``S_t`` of each kind of local work (``between-collectives``, ``step-tail``).
``m_w`` / ``m_s``
    share of the slowdown recovered by idealising the worst 3 % of ranks (at least one) / the
    last pipeline stage (``null``: no stages in a Kineto job's instances).
``explaining_set``
    the smallest set whose idealisation recovers most of the slowdown (greedy, ties shared),
    each rank with its own ``cost`` (share of step time saved when it is fixed), ``late_steps``
    (steps in which it alone costs ``LATE_COST`` of the observed step and ``LATE_OF_WORST`` of
    its cost in its worst step: a steady straggler is late in every step, one with stalls only in
    those), what it costs in the least of those and at the median of the others
    (``least_late``, ``typical_between``: stalls and no steady delay between them) and ``kind``.
``kind``
    ``stragglers.kinds.job_kind`` of the named ranks' late steps: ``persistent``,
    ``intermittent``, ``mixed``, ``rotating`` (the slowdown moves between ranks) or ``none``.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import polars as pl

from kinetoscope.diagnosis.stragglers.kinds import job_kind, rank_kind
from kinetoscope.diagnosis.whatif.kineto import model_from_instances
from kinetoscope.diagnosis.whatif.search import WhatIf, excess_work, explain, groups_per_lane, member_groups
from kinetoscope.diagnosis.whatif.stages import SlowReplica, StageImbalance, slow_replica, stage_imbalance
from kinetoscope.protocol.structinfo import prime_structs

LATE_COST = 0.05  # a rank is late in a step when it alone costs 5 % of the observed step ...
LATE_OF_WORST = 0.5  # ... and half of what it costs in its worst step (stalls vs noise)
STALL_COST = 0.25  # a stall: one rank alone costs a quarter of the ideal step
# A rank of the replay's set joins the named ones when late in this many steps at least (one or
# two host stalls are no straggler), or in every step of a shorter trace.
MIN_RECURRING = 3


class NamedRank(msgspec.Struct, frozen=True):
    """One rank of the explaining set."""

    rank: int
    cost: float  # share of observed step time saved by fixing it (ties share)
    own_cost: float  # S_w - 1: its slowdown when it alone is observed
    late_steps: list[int]
    kind: str  # persistent | intermittent
    peak: float = 0.0  # the largest share of an observed step it alone costs (a stall: STALL_COST)
    typical: float = 0.0  # the median over steps of that share (a steady delay: LATE_COST or more)
    tie_cost: float = 0.0  # share saved by the what-if that named it: it and its tie, together
    least_late: float = 0.0  # the smallest such share in its late steps (stalls: STALL_COST)
    typical_between: float = 0.0  # the median such share in its other steps (steady: LATE_COST)

    def stalled(self) -> bool:
        """Persistent, or alone cost ``STALL_COST`` of a step at least once: an intermittent
        rank below that is late only by the host's noise (on a loaded CPU host a rank alone costs
        up to 10-15 % of a step now and then)."""
        return self.kind == "persistent" or self.peak >= STALL_COST

    def joint_cost(self) -> float:
        """The saving of the what-if that named it, or its own share when larger. Ranks
        tied with each other (slowed together: a node, a replica) are one problem, each carrying
        only its part of the saving; four of them at 4 % each are one problem costing 16 %."""
        return max(self.cost, self.tie_cost)


class WhatIfReport(msgspec.Struct, frozen=True):
    """``stragglers.whatif`` (module docstring)."""

    slowdown: float
    per_rank: dict[str, float]
    per_optype: dict[str, float]
    m_w: float | None
    m_s: float | None
    explaining_set: list[NamedRank]
    recovered_fraction: float
    kind: str
    lost_fraction: float  # summed cost of the explaining set
    fidelity: float  # largest relative error of the unmodified replay's step times
    steps: int
    process_groups: bool = False  # the replay joined process groups or pipeline transfers, not only the job
    transfers: int = 0  # pipeline transfers paired with their peers (``whatif.p2p``) in the replay
    stage: StageImbalance | None = None  # pipeline jobs: the stage what-if (``whatif.stages``)
    replica: SlowReplica | None = None  # pipeline jobs: the replica whose fixing recovers the most
    # per rank in two process groups or more: its local work above the typical peer's, as a
    # share of the job's time, beyond the median rank's (``_excess_work``)
    excess_work: dict[str, float] = msgspec.field(default_factory=dict)

    def ranks(self) -> list[int]:
        """The explaining set's ranks, in naming order."""
        return [n.rank for n in self.explaining_set]

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


def whatif_report(
    instances: pl.DataFrame,
    step_spans: pl.DataFrame,
    host_issued: bool = False,
    links: pl.DataFrame | None = None,
    bd: pl.DataFrame | None = None,
    compute_spans: pl.DataFrame | None = None,
) -> WhatIfReport | None:
    """Replay the job and read the verdict; ``None`` when there is no model (one rank, no
    shared collective). ``host_issued``: arrivals are issue times of asynchronous collectives;
    ``links``: pipeline transfers paired with their peers (``whatif.p2p``); ``bd``: the
    per-rank, per-step table (its ``compute(us)``: a pipeline rank's work, ``whatif.kineto``);
    ``compute_spans``: pipeline ranks' compute intervals (rank, start, end; aligned ns)."""
    compute = None
    if bd is not None and {"rank", "step", "compute(us)"} <= set(bd.columns):
        compute = bd.select("rank", "step", (pl.col("compute(us)") * 1000.0).alias("compute"))
    model = model_from_instances(
        instances,
        step_spans,
        asynchronous=host_issued,
        links=links,
        compute=compute,
        compute_spans=compute_spans,
    )
    if model is None:
        return None
    w = WhatIf(model)
    paired = links is not None and links.height > 0  # a pipeline's ideal is the peer class's
    exp = explain(w, groups=None if paired else member_groups(model))
    ranks = [int(x) for x in model.lane_name]
    steps = sorted(set(step_spans["step"].to_list()))[: model.n_steps]
    step_labels = sorted(set(instances["step"].drop_nulls().to_list()) & set(steps))
    named = [
        _named(exp, lane, g, ranks, step_labels, w.t_obs)
        for lane, g in zip(exp.lanes, zip(exp.gains, exp.option_gains, strict=True), strict=True)
    ]
    per_rank = {str(ranks[c]): 1.0 + exp.own_cost(c) for c in exp.candidates}
    stage = stage_imbalance(model)  # pipeline jobs: M_W and M_S against a stage-balanced ideal
    m_w = _m_w(w, exp) if stage is None else stage.m_w  # pipeline: against the stage-balanced ideal
    fid = float(np.abs(w.t_obs / np.maximum(model.observed_step_time, 1e-12) - 1.0).max())
    return WhatIfReport(
        slowdown=w.slowdown,
        per_rank=per_rank,
        per_optype=w.per_label(),
        m_w=m_w,
        m_s=None if stage is None else stage.m_s,
        explaining_set=named,
        recovered_fraction=exp.recovered_fraction,
        kind=_kind(named, len(step_labels)),
        lost_fraction=float(sum(exp.gains)),
        fidelity=fid,
        steps=model.n_steps,
        process_groups=_grouped(instances, links),
        transfers=int(links["instance"].n_unique()) if links is not None and links.height else 0,
        stage=stage,
        replica=_replica(w, step_labels),
        excess_work=_excess_work(w, ranks),
    )


def _excess_work(w: WhatIf, ranks: list[int]) -> dict[str, float]:
    """``WhatIfReport.excess_work``: each lane's local work above the typical peer's
    (``search.excess_work``) as a share of the observed job's time, less the median lane's,
    for the ranks that synchronise in two process groups or more. On a busy host every rank
    works above the typical peer now and then, so a rank's excess means something only beyond
    the typical rank's. Lateness carries from one group into another only through a rank in
    both; in one group a rank as slow as the typical peer (two slow ranks of three) shows no
    excess at all, so the figure is left out there."""
    share = excess_work(w.model) / max(float(w.t_obs.sum()), 1e-12)
    if not share.size:
        return {}
    above = np.maximum(share - float(np.median(share)), 0.0)
    many = groups_per_lane(w.model) >= 2
    return {str(ranks[i]): round(float(above[i]), 4) for i in np.flatnonzero(many)}


def _replica(w: WhatIf, step_labels: list[int]) -> SlowReplica | None:
    """``whatif.stages.slow_replica`` with its late steps decided like a rank's (``_late``, on
    the replica's own per-step cost as a whole), as the job's step labels."""
    rep = slow_replica(w)
    if rep is None:
        return None
    scale = w.t_ideal / np.maximum(w.t_obs, 1e-12)
    share = np.asarray(rep.step_cost, dtype=np.float64) * scale[: len(rep.step_cost)]
    return msgspec.structs.replace(rep, late_steps=_late(share, step_labels))


def _late(share: Any, steps: list[int]) -> list[int]:
    """The late steps (``stragglers.kinds``) of a rank or a replica whose own cost in each step,
    as a share of the observed step, is ``share``, as the job's step labels ``steps``."""
    return [steps[k] for k in np.flatnonzero(_late_mask(share, len(steps)))]


def _late_mask(share: Any, n_steps: int) -> Any:
    """Per replayed step, whether it is late: ``share`` ``LATE_COST`` or more and
    ``LATE_OF_WORST`` of its worst step's, among the first ``n_steps`` (those with a label)."""
    bar = max(LATE_COST, LATE_OF_WORST * float(share.max(initial=0.0)))
    return (share >= bar) & (np.arange(share.size) < n_steps)


def _grouped(instances: pl.DataFrame, links: pl.DataFrame | None) -> bool:
    """Whether the job's synchronisation is not all job-wide: collectives of process groups
    (instance ids ``<type>@<group>#k``) or paired pipeline transfers."""
    if links is not None and links.height:
        return True
    return bool(instances.height) and bool(instances["instance"].str.contains("@").any())


def _named(
    exp: Any, lane: int, gains: tuple[float, float], ranks: list[int], steps: list[int], t_obs: Any
) -> NamedRank:
    """``gains``: its share of what its what-if saved, and that what-if's whole saving."""
    i = exp.candidates.index(lane)
    # own cost as a share of the observed step
    share = exp.cost[i] * exp.t_ideal[i] / np.maximum(t_obs, 1e-12)
    at = _late_mask(share, len(steps))
    late = [steps[k] for k in np.flatnonzero(at)]
    return NamedRank(
        rank=ranks[lane],
        cost=float(gains[0]),
        own_cost=float(exp.cost[i].mean()),
        late_steps=late,
        kind=rank_kind(len(late), len(steps)),
        peak=float(share.max(initial=0.0)),
        typical=float(np.median(share)) if share.size else 0.0,
        tie_cost=float(gains[1]),
        least_late=float(share[at].min(initial=np.inf)) if at.any() else 0.0,
        typical_between=float(np.median(share[~at])) if (~at).any() else 0.0,
    )


def _m_w(w: WhatIf, exp: Any) -> float | None:
    """``rem`` of the worst 3 % of ranks (at least one) by own cost, with the ranks tied with the
    last of them (own cost within 0.8: tensor-parallel peers slowed together are one worker)."""
    if not exp.candidates:
        return None
    k = max(1, int(np.ceil(w.model.n_lanes * 3 / 100)))
    own = exp.cost.mean(axis=1)
    cut = own[min(k, own.size) - 1]
    if cut > 0:  # ties at the cut (within ``search.explain``'s 0.8): peers slowed together are one worker
        k = max(k, int(np.sum(own >= 0.8 * cut)))
    rem, _ = w.removal([w.selection(list(exp.candidates[:k]), with_transfer=False)])
    return float(rem[0])


def _kind(named: list[NamedRank], n_steps: int) -> str:
    """The replay's kind: ``stragglers.kinds.job_kind`` on the late steps of the named ranks
    that stalled (``NamedRank.stalled``; all of them when none did), as the benchmark's labels
    count every injected stall and a rotating verdict names only the ranks that stalled. A rank
    in the set only by the host's noise is late now and then by a few percent of a step; counted,
    its late steps that fall on another rank's stalls read as ranks late together, and stalls
    moving between ranks as a group."""
    if not named:
        return "none"
    stalled = [n for n in named if n.stalled()] or named
    kind = job_kind({n.rank: n.late_steps for n in stalled}, n_steps)
    return kind if kind != "none" else stalled[0].kind


prime_structs(globals())
