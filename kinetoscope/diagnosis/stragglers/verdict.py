"""Straggler attribution by what-if per collective instance, verdicts, and what fixing costs.

Inputs: the matched collective instances (``breakdown.instance_table``: each rank's aligned
arrival at each instance) and the per-rank, per-step table (``breakdown.rank_breakdown``), both
restricted by the caller to the steps every rank holds.

Why arrivals and not step times: DDP's gradient all-reduce makes every rank's wall step time
equal (the fast ranks wait inside the collective), so a compute straggler is invisible in
per-rank phase or step times (traceml#252). The unit of evidence is the matched collective
*instance*, not the step: one profiled step of a large model holds dozens to thousands of them.

Definitions (``docs/diagnosis.md`` §5 has the reasons and the calibration):

complete instance
    an instance every analysed rank arrived at (partial ones are counted, not attributed: a
    missing rank might have been the last).
typical arrival ``m_i``
    the lower median of the ranks' arrivals at instance ``i`` (of two ranks, the earlier).
last group ``G_i``
    the rank(s) arriving within ``tie_us`` (10 µs) of the last arrival ``L_i`` (ranks that
    arrive last together share what they impose).
imposed wait
    ``(L_i - x_i) / |G_i|`` for each rank of ``G_i``, where ``x_i`` is the latest arrival of a
    rank outside ``G_i``: how much earlier the instance would complete had the rank arrived like
    the next-latest one; 0 for the other ranks. Per step, a rank's imposed wait is the union of
    its intervals ``[L_i - w, L_i]`` (two buckets waiting for one late backward count once).
what-if for a set ``S`` of ranks
    the ranks of ``S`` arrive like the typical rank of the others (``min(a, m'_i)``, ``m'_i`` the
    lower median of the ranks not in ``S``) and are never in the last group; a step's waiting is
    ``|union over its instances of [m_i, L_i]|`` for kernel arrivals (one stream: a wait delays
    every later instance) and ``max over its instances of (L_i - m_i)`` for host issue times
    (gloo: every bucket is issued without waiting, so a running delay counts once; the same
    per-step rule applies to imposed wait); what the set saves in a step is that waiting
    minus the waiting with ``S`` fixed. ``lost_fraction = saved(named ranks) / sum of step
    times``; ``skew_fraction = waiting / sum of step times`` (perfect synchrony).
chance of being last
    ``p0 = mean |G_i| / N'`` (``N'``: the ranks not yet named); ``p_value`` = one-sided binomial ``P(X >= k)`` for a rank in the
    last group at ``k`` of ``n`` instances.
naming (greedy what-if over sets)
    round by round, with the ranks named so far fixed (what-if), the rank imposing the most wait
    is named when **either** (a) it is last far more often than chance (``p_value < alpha / N'``,
    Bonferroni over the free ranks the round may test) and
    its imposed wait without its largest step (one step: instance) is at least
    ``min_rank_effect`` of the step time and ``min_share`` of the
    round's imposed wait (frequency: host load does not hide a rank that is last every time),
    **or** (b) its imposed wait in some step reaches the event threshold (magnitude: a one-off
    stall far beyond the arrival noise), **or** (c) it reaches the persistent threshold in every
    step of two or more (a short trace's steady straggler). The loop stops at the first round
    whose best candidates all fail. Ranks named for (b) alone need ``min_events`` events
    job-wide (one stall is no pattern).
persistent vs intermittent
    a named rank is *persistent* when it is last in at least ``persistent_share`` of the units
    (steps; instances when fewer than ``min_steps_confident`` steps) and last more often than
    chance, or late beyond the persistent threshold in at least that share of the steps; else
    *intermittent*. ``pattern`` says ``steady``, ``steady with spikes`` (a persistent rank
    whose worst step imposes more than ``spike_factor`` times its median step: reported as
    persistent) or ``bursts``.
kind
    ``persistent`` if a named rank is persistent, else ``intermittent`` if ranks are named,
    else ``none``; also ``none`` when the named ranks would save less than ``min_lost_fraction``
    of the step time, or less than ``min_intermittent_lost_fraction`` when none is persistent
    (occasional delays, or arrival jitter).

Modules (one job each): ``attribution`` (instance matrix, imposed wait, what-if rounds, noise),
``stragglers.naming`` (thresholds, naming, persistence), ``slow_link`` (late collective ends),
``stragglers.causes`` (causes compared with peers), ``stragglers.tables`` (per-step and per-rank
tables, next ranks), ``stragglers.model`` (thresholds, report, JSON). This module puts them
together into the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import polars as pl

from kinetoscope.diagnosis.attribution import (
    Matrix,
    Round,
    attribution_round,
    binom_sf,
    build_matrix,
    noise_sigma,
    saving_fixed,
    union_by_group,
)
from kinetoscope.diagnosis.stragglers.causes import rank_cause
from kinetoscope.diagnosis.stragglers.model import (
    PER_RANK_SCHEMA,
    PER_STEP_SCHEMA,
    StragglerReport,
    StragglerThresholds,
)
from kinetoscope.diagnosis.stragglers.naming import (
    Named,
    attach_steady,
    frequency,
    is_persistent,
    late_alone,
    late_floor,
    late_units,
    name_ranks,
    named_alone_by_frequency,
    noise_thresholds,
    pattern_of,
    recount_free,
    spike_share,
    steadily_late,
)
from kinetoscope.diagnosis.stragglers.reconcile import reconcile
from kinetoscope.diagnosis.stragglers.replay_report import whatif_report
from kinetoscope.diagnosis.stragglers.slow_link import SlowLink, end_skew, find_slow_links, link_cause
from kinetoscope.diagnosis.stragglers.steady import steady_skew
from kinetoscope.diagnosis.stragglers.tables import lost_shares, next_ranks, per_rank_table, per_step_table

# former private names, kept for callers and tests that import them from here
_Matrix = Matrix
_slow_link = find_slow_links

__all__ = [
    "PER_RANK_SCHEMA",
    "PER_STEP_SCHEMA",
    "StragglerReport",
    "StragglerThresholds",
    "analyze_stragglers",
    "binom_sf",
    "end_skew",
    "link_cause",
    "noise_sigma",
    "rank_cause",
    "union_by_group",
]


@dataclass
class _Setup:
    """The analysed job: instance matrix, steps, step times (ns) and the first round."""

    mx: Matrix
    steps: list[int]
    bd: pl.DataFrame
    T_ns: np.ndarray
    total_T: float
    r0: Round
    inst: pl.DataFrame


def analyze_stragglers(
    instances: pl.DataFrame,
    breakdown: pl.DataFrame,
    hosts: dict[int, str | None] | None = None,
    thresholds: StragglerThresholds | None = None,
    dropped_steps: int = 0,
    host_issued: bool = False,
    step_spans: pl.DataFrame | None = None,
    links: pl.DataFrame | None = None,
    compute_spans: pl.DataFrame | None = None,
) -> StragglerReport:
    """The straggler verdict (module docstring). ``dropped_steps``: steps left out
    because not every rank holds them (reported); ``host_issued``: the arrivals are host issue
    times (gloo, host ops), so a step loses its largest wait, not the union of its waits;
    ``step_spans`` (rank, step, start, end on the aligned clock): when given, the job is also
    replayed (``stragglers.reconcile``): ``whatif`` in the report, and what it adds to the verdict;
    ``links``: pipeline transfers paired with their peers, for that replay (``whatif.p2p``);
    ``compute_spans``: the pipeline ranks' compute intervals (rank, start, end on the aligned
    clock), which tell the replay's compute from host gaps."""
    th = thresholds or StragglerThresholds()
    hosts = hosts or {}
    rep = StragglerReport(thresholds=th, dropped_steps=dropped_steps)
    su = _setup(instances, breakdown, hosts, th, rep, host_issued)
    if su is None:
        return rep
    mx, steps, T_ns, total_T, r0 = su.mx, su.steps, su.T_ns, su.total_T, su.r0
    sigma, thr_p, thr_i = noise_thresholds(su.inst, steps, r0, T_ns, th)
    rep.sigma_us = sigma / 1000.0
    rep.total_imposed_us = float(r0.imposed.sum()) / 1000.0
    named = name_ranks(mx, r0, th, total_T, thr_p, thr_i, sigma)
    per_step_late = {
        nm.rank: nm.late for nm in named
    }  # before dropping isolated events: still shown per step
    named = _drop_minor_stalls(mx, _drop_isolated(named, steps, th, rep), th)
    rep.skew_fraction = float(r0.waiting.sum()) / total_T if total_T > 0 else None
    rep.transfer_fraction, rep.transfer_spread = _transfer(su.bd, total_T)
    rep.mean_step_time_us = float(T_ns.mean()) / 1000.0
    j = _judge(rep, su, named, th, (sigma, thr_p, thr_i), hosts, per_step_late)
    behind = _steady_among_many(mx, j, float(T_ns.mean()), th)
    if behind:  # most ranks named for arriving after a few early ones, some steadily behind all
        j = _judge(rep, su, behind, th, (sigma, thr_p, thr_i), hosts, per_step_late)
    wi = None
    if step_spans is not None:
        try:
            wi = whatif_report(su.inst, step_spans, host_issued, links, su.bd, compute_spans)
        except ValueError as exc:  # the ranks' orders of collectives contradict each other: no replay
            wi, rep.replay_error = None, str(exc)
    rep.whatif = wi.to_dict() if wi is not None else None
    roles = {nm.rank: ("persistent" if nm in j.persistent else "intermittent") for nm in j.named}
    if not _verdict_none(rep, mx, r0, j.named, j.persistent, th, j.stalled, j.early):
        _verdict(rep, su, j.named, j.persistent, j.intermittent, j.skew_spikes, hosts, th)
    if wi is not None:
        reconcile(rep, wi, th, su.bd, roles)
    return rep


@dataclass
class _Judged:
    """A named set judged (``_judge``): its ranks by role, whether they stalled a step by
    ``rel_step_candidate`` or more, and the few early ranks (``_early_few``)."""

    named: list[Named]
    persistent: list[Named]
    intermittent: list[Named]
    skew_spikes: list[Named]
    stalled: bool
    early: list[int]


def _judge(
    rep: StragglerReport,
    su: _Setup,
    named: list[Named],
    th: StragglerThresholds,
    noise: tuple[float, np.ndarray, np.ndarray],
    hosts: dict[int, str | None],
    per_step_late: dict[int, np.ndarray],
) -> _Judged:
    """What fixing the named ranks saves, their roles, and the report's tables for them
    (``noise``: sigma and the persistent and event thresholds of ``noise_thresholds``)."""
    mx, steps, T_ns, total_T, r0 = su.mx, su.steps, su.T_ns, su.total_T, su.r0
    sigma, thr_p, thr_i = noise
    links = _add_links(mx, th, total_T, named, r0)
    fixed = {nm.rank for nm in named}
    excess = _excess(mx, fixed, links, T_ns)
    rep.lost_fraction = float(excess.sum()) / total_T if total_T > 0 else None
    rep.est_step_time_us = float((T_ns - excess).mean()) / 1000.0
    late_alone(mx, named, thr_p, th, late_floor(mx, th, total_T, sigma))
    recount_free(mx, named)
    attach_steady(mx, named, float(T_ns.mean()), th)
    persistent, intermittent, skew_spikes = _roles(mx, named, th, len(steps) >= th.min_steps_confident)
    final = attribution_round(mx, fixed, th.tie_us * 1000.0)
    rep.per_step = per_step_table(mx, r0, T_ns, excess, thr_i, thr_p, su.bd, per_step_late)
    rep.straggled_steps = int((rep.per_step["late_ranks"].list.len() > 0).sum())
    rep.confidence = _confidence(rep, th)
    roles = {nm.rank: ("persistent" if nm in persistent else "intermittent") for nm in named}
    rep.per_rank = per_rank_table(
        su.bd,
        hosts,
        mx,
        {nm.rank: nm for nm in named},
        roles,
        final=final,
        T_ns=T_ns,
        lost_share=lost_shares(mx, [nm.rank for nm in named]),
    )
    rep.next_ranks = next_ranks(mx, final, fixed, T_ns) if named else []
    stalled = bool((excess >= th.rel_step_candidate * T_ns).any())  # a clear stall, whatever sigma says
    early = _early_few(mx, fixed, excess, thr_p)
    return _Judged(named, persistent, intermittent, skew_spikes, stalled, early)


def _steady_among_many(mx: Matrix, j: _Judged, mean_step_ns: float, th: StragglerThresholds) -> list[Named]:
    """When most ranks were named for arriving after a few early ones (``j.early``), those of
    them steadily behind *every* other rank (``steadily_late`` against the whole job, not the
    few early ones), if they are fewer than half of the ranks; else []. On a loaded host the
    least descheduled ranks arrive first and every other rank is a little after them, which is
    no straggler (``_early_few``); a rank with a small steady delay among those many is one,
    and its steadiness against all its peers tells it from them. Returned afresh, without what
    judging them beside the other named ranks set (``late_alone``, ``recount_free``,
    ``attach_steady``)."""
    if not j.early:
        return []
    behind = [nm for nm in j.named if _behind_all(mx, nm, mean_step_ns, th)]
    if not 0 < 2 * len(behind) < len(mx.ranks):
        return []
    return [replace(nm, alone_late=None, alone_imposed=None, free=0, steady=None) for nm in behind]


def _behind_all(mx: Matrix, nm: Named, mean_step_ns: float, th: StragglerThresholds) -> bool:
    """``nm`` named alone for how often it is last, and steadily late against all other ranks."""
    return named_alone_by_frequency(nm) and steadily_late(
        steady_skew(mx, nm.rank, set(), mean_step_ns), len(mx.ranks), th
    )


def _setup(
    instances: pl.DataFrame,
    breakdown: pl.DataFrame,
    hosts: dict[int, str | None],
    th: StragglerThresholds,
    rep: StragglerReport,
    host_issued: bool = False,
) -> _Setup | None:
    """The instance matrix over the steps every rank holds; ``None`` (with the reason in
    ``rep``) when there is nothing to compare."""
    inst = instances.filter(pl.col("step").is_not_null() & (pl.col("n_ranks") > 1))
    ranks = sorted(set(breakdown["rank"].to_list())) if breakdown.height else []
    if len(ranks) < 2 or inst.is_empty():
        if not ranks and rep.dropped_steps:
            rep.reason = (
                f"the ranks' trace windows share no step ({rep.dropped_steps} step(s), none held by "
                "every rank): nothing to compare; trace the ranks with aligned windows (kscope trace "
                "aligns them by default; --iteration-roundup)"
            )
        elif not ranks:
            rep.reason = "no steps found: nothing to compare"
        elif len(ranks) < 2:
            rep.reason = "single rank: stragglers need at least two ranks"
        else:
            rep.reason = "no collective matched across ranks: no arrival skew to measure"
        rep.per_rank = per_rank_table(breakdown, hosts, None, None, {})
        return None
    steps = sorted(set(inst["step"].to_list()) & set(breakdown["step"].to_list()))
    bd = breakdown.filter(pl.col("step").is_in(steps))
    inst = inst.filter(pl.col("step").is_in(steps) & pl.col("rank").is_in(ranks))
    mx, rep.partial_instances = build_matrix(inst, ranks, steps, host_issued)
    rep.instances = int(mx.A.shape[0])
    T = bd.group_by("step").agg(pl.col("step_time(us)").median().alias("T")).sort("step")
    T_ns = np.array([float(T.filter(pl.col("step") == s)["T"][0]) * 1000.0 for s in steps])
    rep.steps_analysed = len(steps)
    if rep.instances == 0:
        rep.reason = "no collective instance reached by every rank: no arrival order to compare"
        rep.per_rank = per_rank_table(bd, hosts, None, None, {})
        return None
    r0 = attribution_round(mx, set(), th.tie_us * 1000.0)
    return _Setup(mx, steps, bd, T_ns, float(T_ns.sum()), r0, inst)


def _transfer(bd: pl.DataFrame, total_T: float) -> tuple[float | None, float | None]:
    """The collectives' own transfer time (``transfer(us)``: in a collective after every rank
    arrived) as a share of step time: the median rank's, and the spread (largest minus smallest
    rank's share). A ring collective runs at its slowest link's pace on every rank, so a slow
    link or NIC lengthens everybody's transfer alike: a large share with a small spread is a
    slow collective, not a rank straggler."""
    if total_T <= 0 or "transfer(us)" not in bd.columns or bd.is_empty():
        return None, None
    per_rank = (
        bd.group_by("rank").agg(pl.col("transfer(us)").fill_null(0).sum().alias("t"))["t"].to_numpy() * 1000.0
    )
    if per_rank.size == 0:
        return None, None
    return float(np.median(per_rank)) / total_T, float(per_rank.max() - per_rank.min()) / total_T


def _drop_isolated(
    named: list[Named], steps: list[int], th: StragglerThresholds, rep: StragglerReport
) -> list[Named]:
    """Leave out ranks named by magnitude alone when their stalls are fewer than ``min_events``
    job-wide: one stall of one rank is not a pattern (said in the reason). A rank late beyond
    the persistent threshold in every step (``Named.every_step``) is a pattern."""
    events_total = sum(nm.events for nm in named if not nm.freq)
    if events_total >= th.min_events:
        return named
    isolated = [nm for nm in named if not nm.freq and not nm.every_step]
    if isolated:
        s = steps[int(np.flatnonzero(isolated[0].late)[0])] if isolated[0].late.any() else steps[0]
        rep.reason = f"one isolated late arrival (rank {isolated[0].rank}, step {s}) is not a pattern"
    return [nm for nm in named if nm not in isolated]


def _drop_minor_stalls(mx: Matrix, named: list[Named], th: StragglerThresholds) -> list[Named]:
    """Leave out a rank named for one stall alone (magnitude, one event) whose stall adds less
    than ``min_event_share`` (half) of the mean cost of a stall of the named ranks: its share of
    what the named ranks cost (``lost_shares``, measured from the median arrival) below
    ``min_event_share / E`` (``E`` = their stall events). The fewest ranks that explain most of
    the waiting: with the straggler fixed, the punctual rank of a 2-rank job is the last free
    rank, whose every late arrival imposes, and a loaded host descheduling it once used to get
    it named beside the straggler (docs/diagnosis-stragglers.md). Ranks that each stall once at random
    are a pattern of equal stalls and are all kept."""
    if len(named) < 2:
        return named
    events = sum(max(nm.events, 0) for nm in named)
    if events == 0:
        return named
    shares = lost_shares(mx, [nm.rank for nm in named], from_median=True)
    floor = th.min_event_share / events
    return [nm for nm in named if nm.freq or nm.events != 1 or shares[nm.rank] >= floor]


def _add_links(
    mx: Matrix, th: StragglerThresholds, total_T: float, named: list[Named], r0: Round
) -> list[SlowLink]:
    """Attach late-end evidence to the ranks named by arrivals, and name the ranks with late ends
    alone (a slow link delays its own ends, not always its next arrival). Mutates ``named``."""
    links = find_slow_links(mx, th, total_T, set())
    by_arrival = {nm.rank: nm for nm in named}
    for sl in links:
        if sl.rank in by_arrival:
            by_arrival[sl.rank].link = sl
        elif len(named) < th.max_named:
            named.append(Named(sl.rank, True, 0, 0, sl.late_steps, r0, sl.p, sl.late, link=sl, by_link=True))
    return links


def _excess(mx: Matrix, fixed: set[int], links: list[SlowLink], T_ns: np.ndarray) -> np.ndarray:
    """Per step, what the named ranks cost (ns): the what-if saving, or the late ends when larger
    (never both: a late end that delays the next arrival is already in the what-if)."""
    excess = saving_fixed(mx, set(), fixed)
    if links:
        ends = np.sum([sl.per_step_ns for sl in links], axis=0)
        excess = np.minimum(np.maximum(excess, ends), T_ns)
    return excess


def _roles(
    mx: Matrix, named: list[Named], th: StragglerThresholds, by_steps: bool
) -> tuple[list[Named], list[Named], list[Named]]:
    """Persistent, intermittent and "steady skew with spikes" ranks (the last reported as
    intermittent: a steady small skew whose time is mostly lost in a few spikes)."""
    persistent: list[Named] = []
    intermittent: list[Named] = []
    for nm in named:
        (persistent if is_persistent(nm, mx, th, by_steps) else intermittent).append(nm)
    link_named = [nm for nm in named if nm.by_link]
    skew_spikes = [nm for nm in persistent if nm not in link_named and spike_share(nm, mx, th) >= 0.5]
    persistent = [nm for nm in persistent if nm not in skew_spikes]
    intermittent += skew_spikes
    skew_spikes += [
        nm
        for nm in intermittent
        if nm not in skew_spikes
        and nm not in link_named
        and by_steps
        and nm.late.mean() >= th.persistent_share
        and spike_share(nm, mx, th) >= 0.5
    ]
    return persistent, intermittent, skew_spikes


def _verdict_none(
    rep: StragglerReport,
    mx: Matrix,
    r0: Round,
    named: list[Named],
    persistent: list[Named],
    th: StragglerThresholds,
    stalled: bool,
    early: list[int],
) -> bool:
    """Set kind ``none`` and its reason when nothing is named, the named ranks cost too little,
    it is arrival jitter, or most ranks were named for arriving a little after a few early ones
    (``early``: those few, see ``_early_few``); False when there is a straggler verdict to give.
    ``stalled``: the named ranks cost ``rel_step_candidate`` of a step or more in some step."""
    lost = rep.lost_fraction or 0.0
    jitter = _only_jitter(named, persistent, lost, th, mx, stalled)
    minor = _minor_bursts(named, persistent, lost, th)
    if named and lost >= th.min_lost_fraction and not jitter and not minor and not early:
        return False
    rep.kind = "none"
    if early:
        rep.reason = (
            f"rank(s) {[nm.rank for nm in named]}, {len(named)} of the {len(mx.ranks)} ranks, arrive after "
            f"rank(s) {early}, but never by more than the noise threshold in a step ({100 * lost:.1f}% of "
            f"step time): those few are early, not the others late"
        )
    elif jitter and lost < th.min_jitter_lost_fraction:
        rep.reason = (
            f"rank(s) {[nm.rank for nm in named]} are last more often than chance, but in under half of the "
            f"steps and with no stall beyond the noise, costing {100 * lost:.1f}% of step time "
            f"(< {100 * th.min_jitter_lost_fraction:g}%): arrival jitter, not a straggler"
        )
    elif jitter:
        rep.reason = (
            f"rank(s) {[nm.rank for nm in named]} are last more often than chance at the collectives, but "
            f"late in no more steps than chance gives and never beyond the noise ({100 * lost:.1f}% of step "
            "time): arrival jitter from the host, not a straggler"
        )
    elif minor and lost >= th.min_lost_fraction:
        late = sorted({int(k) for nm in named for k in np.flatnonzero(nm.late_steps)})
        rep.reason = (
            f"rank(s) {[nm.rank for nm in named]} were late in {len(late)}/{len(mx.steps)} steps, but none "
            f"is persistent, together costing {100 * lost:.1f}% of step time "
            f"(< {100 * th.min_intermittent_lost_fraction:g}%): occasional delays, not a straggler worth acting on"
        )
    elif named:
        rep.reason = (
            f"rank(s) {[nm.rank for nm in named]} make the others wait, but fixing them would save only "
            f"{100 * lost:.1f}% of step time (< {100 * th.min_lost_fraction:g}%)"
        )
    elif not rep.reason:
        rep.reason = _nobody_reason(mx, r0, rep, th)
    rep.reason += _ring_note(rep, th)
    return True


def _nobody_reason(mx: Matrix, r0: Round, rep: StragglerReport, th: StragglerThresholds) -> str:
    """Why no rank is named, about the rank imposing the most wait: last no more often than
    chance, or last far more often (at 64 ranks, a rank last at 4 of 8 collectives) but costing
    too little to be named: the reason must not deny the frequency that the table shows."""
    top = int(np.argmax(r0.imposed.sum(axis=0)))
    k, p = frequency(r0, top, np.ones(len(mx.step_idx), dtype=bool))
    last = f"at {k}/{rep.instances} collectives, chance {100 * r0.p0:.0f}%"
    total_ns = (rep.mean_step_time_us or 0.0) * 1000.0 * len(mx.steps)
    if p < th.alpha / r0.free and total_ns > 0:
        share = float(r0.step_imposed[:, top].sum()) / total_ns  # as per_rank's imposed_wait(us)
        return (
            f"rank {mx.ranks[top]} is last far more often than chance ({last}, p={p:.2g}), but the wait it "
            f"imposes, {100 * share:.1f}% of step time, is too little to name it"
        )
    return (
        f"no rank is last far more often than chance or late beyond the noise (most often last: "
        f"rank {mx.ranks[top]} {last})"
    )


def _ring_note(rep: StragglerReport, th: StragglerThresholds) -> str:
    """A note for a ``none`` verdict whose collectives' own transfer is a large share of the
    step on every rank alike: a slow link or NIC slows a whole ring and names no rank."""
    tf, spread = rep.transfer_fraction, rep.transfer_spread
    if tf is None or spread is None or tf < th.ring_note_fraction or spread > 0.25 * tf:
        return ""
    return (
        f"; the collectives' own transfer takes {100 * tf:.0f}% of step time on every rank alike "
        f"(spread {100 * spread:.1f}%): if that is more than their bytes need, a slow link or NIC is "
        "slowing the whole ring, which names no rank"
    )


def _verdict(
    rep: StragglerReport,
    su: _Setup,
    named: list[Named],
    persistent: list[Named],
    intermittent: list[Named],
    skew_spikes: list[Named],
    hosts: dict[int, str | None],
    th: StragglerThresholds,
) -> None:
    """Kind, ranks (in naming order: each is the one that explained most once the previous were
    fixed), pattern, recurrent ranks, reason and causes of a straggler verdict."""
    mx = su.mx
    if persistent:
        rep.kind = "persistent"
        rep.ranks = [nm.rank for nm in named if nm in persistent]
        rep.intermittent_ranks = [nm.rank for nm in named if nm in intermittent]
    else:
        rep.kind = "intermittent"
        rep.ranks = [nm.rank for nm in named]
        rep.intermittent_ranks = list(rep.ranks)
    rep.pattern = pattern_of(persistent, skew_spikes, mx, th)
    counts = {nm.rank: int(nm.late_steps.sum()) for nm in intermittent}
    rep.recurrent_ranks = sorted(
        r
        for r, c in counts.items()
        if c >= 3 and c / max(rep.straggled_steps, 1) >= th.recurrent_concentration
    )
    rep.hosts = {r: hosts.get(r) for r in rep.ranks}
    rep.groups = _groups(named, set(rep.ranks))
    rep.steady = {
        nm.rank: nm.steady.to_dict() for nm in named if nm.steady is not None and nm.rank in rep.ranks
    }
    rep.reason = _reason(rep, named, mx.ranks)
    late_of = {nm.rank: [mx.steps[k] for k in np.flatnonzero(nm.late_steps)] for nm in named}
    link_of = {nm.rank: nm.link for nm in named if nm.link is not None}
    rep.causes = {
        r: link_cause(link_of[r], len(su.steps), su.total_T)
        if r in link_of
        else rank_cause(su.bd, r, late_of.get(r))
        for r in rep.ranks
    }
    rep.cause = "; ".join(f"rank {r}: {c['text']}" for r, c in rep.causes.items())


def _groups(named: list[Named], ranks: set[int]) -> list[dict[str, Any]]:
    """The groups of named ranks late together (``_group``), each once: members, at how many
    collectives they were the latest ones as a set, the chance of a given set being so, p."""
    groups = {nm.group.members: nm.group for nm in named if nm.group is not None and nm.rank in ranks}
    return [g.to_dict() for g in groups.values()]


def _only_jitter(
    named: list[Named],
    persistent: list[Named],
    lost: float,
    th: StragglerThresholds,
    mx: Matrix,
    stalled: bool,
) -> bool:
    """True when every named rank is intermittent and was named for how often it is last alone
    (no stall beyond the event threshold, no late collective ends), and either they cost less
    than ``min_jitter_lost_fraction`` of the step or, in a trace with the steps to judge it,
    none is late in more steps than chance gives and no step lost ``rel_step_candidate`` of its
    time to them (``stalled``: stalls that inflate sigma hide from the event threshold, not from
    this): on a loaded host one rank, or two sharing a core, is often preempted a little more
    than its peers. Last more often than chance at the instances, but neither steadily late nor
    ever stalling: arrival jitter, not a straggler. A steady delay (persistent) keeps the lower
    ``min_lost_fraction`` floor. A lone rank that is the last one at most of the collectives is
    not jitter whatever its steps say: the host's preemptions spread the last place over the ranks,
    they do not give one rank most of it (``_last_at_most``)."""
    if not named or persistent:
        return False
    if not all(nm.freq and nm.events == 0 and not nm.by_link and nm.link is None for nm in named):
        return False
    if lost < th.min_jitter_lost_fraction:
        return True
    if len(named) == 1 and _last_at_most(named[0]):
        return False
    return (
        not stalled
        and len(mx.steps) >= th.min_steps_confident
        and all(late_units(nm, mx, True)[2] >= th.alpha for nm in named)
    )


def _last_at_most(nm: Named) -> bool:
    """The last rank at more than half of all the collective instances of its naming round."""
    return bool(nm.k > 0.5 * nm.rnd.last.shape[0])


def _early_few(mx: Matrix, fixed: set[int], excess: np.ndarray, thr_p: np.ndarray) -> list[int]:
    """The ranks not named, when the named ranks are most of the job and what they cost stays
    under the persistent threshold in every step (else []). Fixing most of the ranks measures
    them against the few others (``saving_fixed``): when those few are earlier beyond the noise
    (3 ranks, 2 of them 30 ms late; or stalls in some steps), the many are the stragglers; when
    only by the jitter (a loaded host's least descheduled process), the few are early and
    nobody is a straggler worth naming."""
    if len(fixed) * 2 <= len(mx.ranks) or bool((excess >= thr_p).any()):
        return []
    return [r for r in mx.ranks if r not in fixed]


def _minor_bursts(named: list[Named], persistent: list[Named], lost: float, th: StragglerThresholds) -> bool:
    """True when ranks are named but none is persistent and together they cost less than
    ``min_intermittent_lost_fraction`` of the step: a few short stalls (a loaded host
    descheduling a rank now and then) are occasional delays, not a straggler worth acting on. A
    steady delay (persistent) keeps the lower ``min_lost_fraction`` floor."""
    return bool(named) and not persistent and lost < th.min_intermittent_lost_fraction


def _confidence(rep: StragglerReport, th: StragglerThresholds) -> str:
    """``high``: at least ``min_steps_confident`` steps or 32 instances; ``medium``: at least 8
    instances (one step of a large model); else ``low``."""
    if rep.steps_analysed >= th.min_steps_confident or rep.instances >= 32:
        return "high"
    return "medium" if rep.instances >= 8 else "low"


def _reason(rep: StragglerReport, named: list[Named], ranks: list[int]) -> str:
    """One segment per named rank with its own evidence: late collective ends (slow link), stalls
    beyond the noise (magnitude), or how often it was last against chance (frequency)."""
    parts = []
    for nm in named:
        if nm.rank not in rep.ranks and nm.rank not in rep.intermittent_ranks:
            continue
        if nm.link is not None and nm.by_link:
            parts.append(
                f"rank {nm.rank}'s collectives end late after its peers' at {nm.link.late}/{nm.link.instances} "
                f"collectives ({nm.link.late} of the {nm.link.events} late ends, chance 1/{nm.link.world}, "
                f"p={nm.p:.2g}), late in {int(nm.late_steps.sum())}/{rep.steps_analysed} steps"
            )
            continue
        late = f"late in {int(nm.late_steps.sum())}/{rep.steps_analysed} steps"
        g = nm.together
        if g is not None:  # one segment for a group or a pair: their evidence is theirs together
            if nm.rank == g.members[0]:
                parts.append(
                    f"ranks {', '.join(map(str, g.members))} the {len(g.members)} latest together at "
                    f"{g.k}/{g.n} collectives (chance {100 * g.p0:.2g}%, p={g.p:.2g}), {late}"
                )
            continue
        last = (
            f"rank {nm.rank} last at {nm.k}/{rep.instances} collectives (chance {100 * nm.rnd.p0:.0f}%, "
            f"p={nm.p:.2g}), "
        )
        if not nm.freq:  # named for its stalls: they are its evidence
            per_step = nm.rnd.step_imposed[:, ranks.index(nm.rank)] / 1e6
            # the last rank not named has no peer to share the chance of being last with
            head = f"rank {nm.rank} " if nm.rnd.free <= 1 else last
            if nm.every_step and not nm.events:  # named for being late beyond that threshold in every step
                parts.append(
                    f"{head}late by {per_step.min():.1f}-{per_step.max():.1f} ms in every step, beyond "
                    f"the noise's persistent threshold, {late}"
                )
                continue
            parts.append(
                f"{head}stalled beyond the noise in {nm.events} step(s) (up to {per_step.max():.1f} ms), {late}"
            )
            continue
        steady = ""
        if nm.steady is not None and nm.steady.late:
            s = nm.steady
            steady = (
                f", behind the others' mean arrival in {s.behind}/{s.steps} steps by {100 * s.median_share:.1f}% of "
                f"a step (t-test p={s.p:.2g})"
            )
        parts.append(f"{last}{late}{steady}")
    return "; ".join(parts)
