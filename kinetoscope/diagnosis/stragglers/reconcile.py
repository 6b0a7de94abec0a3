"""What the replay adds to the straggler verdict (``reconcile``), in the terms of its report
(``stragglers.replay_report``: ``slowdown``, the ``explaining_set`` and each named rank's
``late_steps``, ``kind``, costs). The rules of ``stragglers.verdict`` decide first; a faithful
replay (``_faithful``) then overrules, completes or re-kinds what they named, each step with its
reason in its docstring and in ``docs/diagnosis.md``, "What the replay changes in the verdict".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from kinetoscope.diagnosis.attribution import binom_sf
from kinetoscope.diagnosis.stragglers.causes import rank_cause
from kinetoscope.diagnosis.stragglers.kinds import rank_kind
from kinetoscope.diagnosis.stragglers.model import StragglerReport, StragglerThresholds
from kinetoscope.diagnosis.stragglers.replay_report import (
    LATE_COST,
    MIN_RECURRING,
    STALL_COST,
    NamedRank,
    WhatIfReport,
)
from kinetoscope.diagnosis.whatif.search import MIN_GAIN
from kinetoscope.diagnosis.whatif.stages import SlowReplica


def reconcile(
    rep: StragglerReport,
    wi: WhatIfReport,
    th: StragglerThresholds,
    bd: pl.DataFrame,
    named_roles: dict[int, str],
) -> None:
    """What the replays add to the verdict (in place), in this order:

    * on a pipeline job whose worst stage explains the slowdown, no straggler: stage imbalance
      (``as_stage_imbalance``);
    * an intermittent verdict of ranks that each stalled in a step or two, where an exact
      replay finds only the host's noise (no rank that recurs or stalls, and little to save), is
      ``none`` (``as_isolated_stalls``);
    * a pipeline replica that explains the slowdown and saves more than the replay's set
      (``_replica_saves_more``) is named as a whole (``as_slow_replica``);
    * on a pipeline job whose transfers the replay paired, the replay's explaining set replaces
      the rules' ranks (``adopt_group_set``), or when it lies within a replica that saves
      little more (``as_set_within_replica``); else a replica that explains the slowdown is named;
    * ``rotating`` (``stragglers.kinds``): when the replay reads the stalls as moving between
      ranks, and the rules named nobody, or intermittent ranks, or ranks the replay sees late in
      only a few steps and not steadily (each in its explaining set as intermittent, its median
      share of a step below ``LATE_COST``), the verdict is ``rotating`` and names every rank of
      the replay's set that stalled (``_as_rotating``), when those are two ranks or more costing
      ``min_intermittent_lost_fraction`` of step time or more together (what the verdict names
      is what must cost enough: the replay's set can hold ranks late by the noise alone);
    * otherwise, a rank of the replay's explaining set the rules did not name, late in
      ``MIN_RECURRING`` steps or more, or in every step of a shorter trace (which shows no
      recurrence), by the replay or by the rules for a rank they listed as
      intermittent beside the named ones, and costing ``min_intermittent_lost_fraction``
      of step time or more, joins the named ranks (a co-straggler the rules missed: one
      masked by a bigger one at the collectives, or one that stalls in a few steps beside a
      steady one), with the replay's kind; with ranks of both kinds the verdict is ``mixed``
      (``_join``); a ``none`` verdict takes a faithful replay's ranks that recur and cost
      enough (``as_replay_straggler``). How much a rank costs *relative to* the named ones
      plays no part: the explaining set already holds only ranks whose fixing saves
      ``search.MIN_GAIN`` of step time, given those before them;
    * then a named intermittent rank that a faithful replay sees steadily late in most steps is
      persistent (``_steady_by_the_replay``), and a named persistent rank it sees stall in half
      of the steps or fewer, and not late between them, is intermittent
      (``_stalls_by_the_replay``); on a one-step trace where a rank joins, each named rank's
      kind comes from its collectives (``_kinds_by_collectives``).
    """
    if as_stage_imbalance(rep, wi) or as_isolated_stalls(rep, wi, th):
        return
    if wi.replica is not None and _replica_saves_more(wi):
        if set(rep.ranks) == set(wi.replica.ranks) or as_slow_replica(rep, wi, bd, th):
            return  # the replica, named by the rules already or now
    if adopt_group_set(rep, wi, bd) or as_set_within_replica(rep, wi, bd):
        return
    if as_slow_replica(rep, wi, bd, th):
        return
    rotation = _rotation(rep, wi, th)
    if rotation is not None:
        _as_rotating(rep, bd, *rotation)
        return
    if as_replay_straggler(rep, wi, bd, th):
        return
    if rep.kind in ("persistent", "intermittent", "mixed") and rep.ranks:
        _prune(rep, wi, th)
        extra = _joining(rep, wi, th)
        if extra:
            _join(rep, wi, bd, named_roles, extra, th)
        _steady_by_the_replay(rep, wi, th)
        _stalls_by_the_replay(rep, wi)


def _steady_by_the_replay(rep: StragglerReport, wi: WhatIfReport, th: StragglerThresholds) -> None:
    """A named rank the rules call intermittent that a faithful replay (``_faithful``) sees late
    in most steps, ``MIN_RECURRING`` or more, by a steady delay (``typical`` >= ``LATE_COST``),
    and in more of them than chance gives one rank of the job (``_steady_delay``), is persistent
    (in place; the verdict ``mixed`` when intermittent ranks remain). The rules judge a pair late
    together against chance (either of two of five ranks last in 10 of 16 steps is not rare), so
    two ranks slowed alike beside a third that stalls read as intermittent; the replay measures
    each one's own delay in every step. Only this way: a replay that sees a rank late in fewer
    steps does not demote it (a small steady delay on a loaded host is late by the replay's bar
    in only some steps)."""
    if rep.kind not in ("intermittent", "mixed") or not _faithful(wi):
        return
    seen = {n.rank: n for n in wi.explaining_set}
    world = max(rep.per_rank.height, 2)
    steady = [
        r
        for r in rep.ranks
        if r in rep.intermittent_ranks and r in seen and _steady_delay(seen[r], wi.steps, world, th.alpha)
    ]
    if not steady:
        return
    roles = rep.per_rank_column("role")  # a rank the replay joined is intermittent by its role
    left = [
        r
        for r in rep.ranks
        if r not in steady and (r in rep.intermittent_ranks or roles.get(str(r)) == "intermittent")
    ]
    rep.intermittent_ranks = [r for r in rep.intermittent_ranks if r not in steady]
    rep.recurrent_ranks = [r for r in rep.recurrent_ranks if r not in steady]  # of the intermittent
    rep.kind = "mixed" if left else "persistent"
    if rep.kind == "persistent" and rep.pattern == "bursts":
        rep.pattern = "steady"
    _set_roles(rep, dict.fromkeys(steady, "persistent"), clear=False)


def _stalls_by_the_replay(rep: StragglerReport, wi: WhatIfReport) -> None:
    """A named rank the rules call persistent that a faithful replay (``_faithful``) sees late
    in half of the steps or fewer, by a stall in each of them (alone ``STALL_COST`` of the step
    or more: ``NamedRank.least_late``) and by no steady delay in the others (their median below
    ``LATE_COST``: ``NamedRank.typical_between``), is intermittent (in place; the verdict
    ``mixed`` when persistent ranks remain, else ``intermittent``).

    Why: a rank that stalls in about half of the steps sits on the kinds' boundary, and the
    rules count its late steps from arrivals that a loaded host shifts now and then (a rank
    stalling in 8 of 16 steps read as late in 9 or 10); the replay measures its own delay in
    every step. A small steady delay the replay sees late in only some steps stays persistent:
    its late steps are no stalls; so does a steady delay with spikes: it is late between them
    too."""
    if rep.kind not in ("persistent", "mixed") or not _faithful(wi) or _named_make_the_median(rep):
        return
    seen = {n.rank: n for n in wi.explaining_set}
    stalls = [
        r
        for r in rep.ranks
        if r not in rep.intermittent_ranks
        and r in seen
        and seen[r].late_steps
        and seen[r].kind == "intermittent"
        and seen[r].least_late >= STALL_COST
        and seen[r].typical_between < LATE_COST
    ]
    if not stalls:
        return
    rep.intermittent_ranks = rep.intermittent_ranks + stalls
    steady = [r for r in rep.ranks if r not in rep.intermittent_ranks]
    rep.kind = "mixed" if steady else "intermittent"
    if rep.kind == "intermittent" and rep.pattern == "steady":
        rep.pattern = "bursts"
    _set_late(rep, {r: len(seen[r].late_steps) for r in stalls})  # the replay's count, as the kind
    _set_roles(rep, dict.fromkeys(stalls, "intermittent"), clear=False)


def _steady_delay(n: NamedRank, steps: int, world: int, alpha: float) -> bool:
    """Late in most of the ``steps`` replayed, ``MIN_RECURRING`` or more, by ``LATE_COST`` of a
    step at the median, and in more steps than chance (binomial against one rank of ``world``
    being the late one, p < ``alpha``): a steady delay, not stalls. With two ranks, one of them
    late in 8 of 12 steps is what chance gives (p = 0.19)."""
    late = len(n.late_steps)
    steady = late >= MIN_RECURRING and rank_kind(late, steps) == "persistent" and n.typical >= LATE_COST
    return steady and binom_sf(late, steps, 1.0 / world) < alpha


def _rotation(
    rep: StragglerReport, wi: WhatIfReport, th: StragglerThresholds
) -> tuple[list[NamedRank], list[int]] | None:
    """What a ``rotating`` verdict names (``_rotating_ranks``) when the verdict becomes one
    (``reconcile``), else ``None``."""
    if wi.kind != "rotating" or rep.skew_fraction is None:
        return None
    moving, ruled = _rotating_ranks(rep, wi)
    if len(moving) + len(ruled) < 2 or _rotating_cost(rep, moving, ruled) < th.min_intermittent_lost_fraction:
        return None  # judged on what the verdict would name: two ranks at least, costing enough
    if rep.kind in ("none", "intermittent"):
        return moving, ruled
    seen = {n.rank: n for n in wi.explaining_set}
    overturned = (
        rep.kind in ("persistent", "mixed")
        and not _named_make_the_median(rep)
        and all(
            r in seen and seen[r].kind == "intermittent" and seen[r].typical < LATE_COST for r in rep.ranks
        )
    )
    return (moving, ruled) if overturned else None


def _named_make_the_median(rep: StragglerReport) -> bool:
    """Whether the ranks the rules named, slow together, would be the job's typical peer (the
    lower median of its ``n`` ranks: ``k >= n - (n - 1) // 2`` of them, e.g. two of three).
    The replay measures every rank against that peer, so there it sees their steady delay as
    nobody's and only their jitter against each other; it cannot overturn a steady verdict.
    (``search.ideal_without`` moves the yardstick only where three others remain.)"""
    n, k = rep.per_rank.height, len(rep.ranks)
    return n > 0 and k >= n - (n - 1) // 2


def _rotating_ranks(rep: StragglerReport, wi: WhatIfReport) -> tuple[list[NamedRank], list[int]]:
    """What a ``rotating`` verdict names (``_as_rotating``): the replay's ranks that stalled, and
    the intermittent ranks the rules named beside them (empty: no rotating verdict) unless the
    replay weighed and left out a rank the rules found late again and again (``_noise``)."""
    moving = [n for n in wi.explaining_set if n.late_steps and n.stalled()]
    own = {n.rank for n in moving}
    if rep.kind != "intermittent":
        return moving, []
    late = rep.per_rank_column("late_steps")
    ruled = [r for r in rep.ranks if r not in own and not _noise(wi, r, int(late.get(str(r)) or 0))]
    return moving, ruled


def _noise(wi: WhatIfReport, rank: int, late_steps: int) -> bool:
    """A rank the rules named intermittent that the replay finds to be the host's noise: late
    in ``MIN_RECURRING`` steps or more by the rules' count, alone costing ``search.MIN_GAIN`` of
    the observed step time or more (so the search could have named it), and still left out of
    the explaining set: with the set's ranks fixed, fixing it saves too little, because the
    host made the other ranks late in the same steps too. (``per_rank`` is a slowdown against
    the ideal step, hence the division by the job's.) A rank with one or two stalls stays: the
    rules' stall is what the rotating verdict names it for, however the search ranked it."""
    alone = (wi.per_rank.get(str(rank), 1.0) - 1.0) / max(wi.slowdown, 1.0)  # of the observed step
    return late_steps >= MIN_RECURRING and alone >= MIN_GAIN


GROUP_RECOVERED = 0.5  # the replay's set must recover half of the slowdown to replace the rules' ranks
MIN_SLOWDOWN = 0.01  # ... of a slowdown of 1 % at least
MAX_FIDELITY_ERROR = 0.01  # ... from a replay reproducing every step time within 1 %
SET_EXPLAINS = 0.9  # a replay set inside a slow replica that recovers this much is named, not the replica


def as_stage_imbalance(rep: StragglerReport, wi: WhatIfReport) -> bool:
    """On a pipeline job whose stage what-if explains the slowdown (``whatif.stages``:
    balancing the worst stage recovers most of it, fixing the worst workers does not) and whose
    replay names no worker outside that stage, the ranks the rules named (the stages that waited for the slow one)
    are no stragglers: the verdict is ``none`` and its reason names the stage (in place; True
    when done)."""
    st = wi.stage
    if st is None or not st.explains or not set(wi.ranks()) <= set(st.ranks):
        return False
    if rep.kind not in ("persistent", "intermittent", "mixed"):
        return False
    rep.kind = "none"
    rep.ranks, rep.recurrent_ranks, rep.intermittent_ranks = [], [], []
    rep.reason = (
        f"stage imbalance, not a straggler: pipeline stage {st.stage} (ranks {st.ranks}) is slow on every "
        f"replica; balancing the stages recovers {100 * st.recovered:.0f}% of a slowdown of {st.slowdown:.2f}x "
        f"(M_S {st.m_s:.2f}), fixing single ranks {100 * (wi.m_w or 0.0):.0f}%"
    )
    return True


def adopt_group_set(rep: StragglerReport, wi: WhatIfReport, bd: pl.DataFrame) -> bool:
    """On a pipeline job whose transfers the replay paired with their peers, the ranks the rules
    named are replaced by the replay's explaining set when the two differ, the set recovers
    ``GROUP_RECOVERED`` to ``1 / GROUP_RECOVERED`` of a slowdown of ``MIN_SLOWDOWN`` or more,
    the replay reproduces the step times within ``MAX_FIDELITY_ERROR``, and its whole slowdown
    (``1 - 1 / slowdown`` of step time) is ``GROUP_RECOVERED`` or more of what the rules
    measured the named ranks cost (in place; True when done). A replay that sees far less lost
    time than the arrivals show reads some wait as work (one no trace event marks as a wait)
    and cannot say who caused it. Jobs without paired transfers
    keep the rules' ranks (on gloo, whose collectives the replay reads as issued without
    waiting, the members of a tensor-parallel group tie).

    Why: the rules compare arrivals collective by collective, so the members of a slowed
    rank's groups, and the stages downstream of a slowed pipeline worker, arrive late too and
    are named; the replay propagates a late arrival through the groups and the transfers, and
    idealising the slowed rank recovers their wait. The rules' noise decisions stand: a ``none``
    verdict is kept (``rotating`` is read as before).
    """
    named = wi.explaining_set
    if not wi.transfers or not named or not GROUP_RECOVERED <= wi.recovered_fraction <= 1.0 / GROUP_RECOVERED:
        return False
    if wi.slowdown < 1.0 + MIN_SLOWDOWN or wi.fidelity > MAX_FIDELITY_ERROR:
        return False
    if rep.kind not in ("persistent", "intermittent", "mixed") or set(rep.ranks) == set(wi.ranks()):
        return False
    if 1.0 - 1.0 / wi.slowdown < GROUP_RECOVERED * (rep.lost_fraction or 0.0):
        return False  # the replay missed most of what the rules measured lost: a wait it reads as work
    _adopt(rep, wi, bd, named, wi.lost_fraction, wi.recovered_fraction)
    return True


def _replica_saves_more(wi: WhatIfReport) -> bool:
    """The replica that explains the slowdown (``whatif.stages.SlowReplica``) holds the replay's
    explaining set and, made ideal as a whole, saves ``MIN_GAIN`` of step time more than the set:
    the search's own bar for naming a further option. Its ranks slowed together mask each other
    (one made ideal alone leaves the others slow), so the rank-by-rank search stops short of
    them, as for two equal stragglers."""
    r = wi.replica
    if r is None or not r.explains or not set(wi.ranks()) <= set(r.ranks):
        return False
    return _replica_saving(wi, r) - wi.lost_fraction >= MIN_GAIN


def _set_explains_the_replica(wi: WhatIfReport, r: SlowReplica) -> bool:
    """The replay's explaining set, a part of replica ``r``, recovers ``SET_EXPLAINS`` of the
    slowdown, and the whole replica saves less than ``MIN_GAIN`` of step time more: one slowed
    rank holds its whole replica back (its pipeline neighbours wait for it, then the replica's
    data-parallel collectives), and the smallest set that explains the slowdown is that rank,
    not the replica."""
    inside = bool(wi.explaining_set) and set(wi.ranks()) < set(r.ranks)
    return inside and wi.recovered_fraction >= SET_EXPLAINS and not _replica_saves_more(wi)


def as_set_within_replica(rep: StragglerReport, wi: WhatIfReport, bd: pl.DataFrame) -> bool:
    """The replay's explaining set replaces the rules' ranks when it lies within a pipeline
    replica that explains the slowdown and explains it as well (``_set_explains_the_replica``),
    and the rules named neither it nor that replica (in place; True when done). The group-set
    reading (``adopt_group_set``) asks the replay to see half of what the rules measured lost;
    the replica reading does not, and would name the whole replica of one slowed rank."""
    r = wi.replica
    if r is None or not r.explains or not _set_explains_the_replica(wi, r):
        return False
    if set(rep.ranks) in (set(r.ranks), set(wi.ranks())):
        return False
    _adopt(rep, wi, bd, wi.explaining_set, wi.lost_fraction, wi.recovered_fraction)
    return True


def _replica_saving(wi: WhatIfReport, r: SlowReplica) -> float:
    """The share of the observed step time making replica ``r`` ideal saves."""
    return r.recovered * (1.0 - 1.0 / max(wi.slowdown, 1e-12))


def as_slow_replica(
    rep: StragglerReport, wi: WhatIfReport, bd: pl.DataFrame, th: StragglerThresholds
) -> bool:
    """On a pipeline job whose slowdown one replica explains (``whatif.stages.SlowReplica``),
    the verdict names that replica's ranks (in place; True when done) when the replica is late
    in most steps (``persistent``), whatever the rules said: its ranks sleep or compute more
    together, so each alone is late by little and the rules, rank by rank, read noise; or, late
    in fewer steps, when the rules named some of its ranks and no other: the replica completes
    what they found. A replica that stalls in some steps holds each of its ranks back by the
    whole stall at its data-parallel collective, so the rules' noise test sees it, rank by rank,
    as well as the replay does; where they read such stalls as noise, so are they (a host busier
    than its cores holds one replica or the other back now and then). It saves
    ``min_intermittent_lost_fraction`` of step time or more, the bar of a replay rank
    (``as_replay_straggler``, ``_joining``): the replicas of a stage are each other's
    yardstick, with two of them the faster one in every step, so the host's jitter alone makes
    either look a few percent slow."""
    r = wi.replica
    if r is None or not r.explains or set(rep.ranks) == set(r.ranks) or _set_explains_the_replica(wi, r):
        return False
    lost = _replica_saving(wi, r)
    if lost < th.min_intermittent_lost_fraction:
        return False
    kind = rank_kind(len(r.late_steps), wi.steps)
    found = bool(rep.ranks) and set(rep.ranks) <= set(r.ranks)  # the rules saw part of it
    if not (found or kind == "persistent"):
        return False
    named = [NamedRank(x, lost / len(r.ranks), r.cost, r.late_steps, kind, tie_cost=lost) for x in r.ranks]
    _adopt(rep, wi, bd, named, lost, r.recovered)
    rep.reason = (
        f"the replay over the job's pipeline transfers: ranks {rep.ranks}, one pipeline replica, are slow together; "
        f"making them work like the other replicas recovers {100 * r.recovered:.0f}% of the slowdown"
    )
    return True


def _adopt(
    rep: StragglerReport,
    wi: WhatIfReport,
    bd: pl.DataFrame,
    named: list[NamedRank],
    lost: float,
    recovered: float,
) -> None:
    """The verdict names ``named`` (the replay's ranks) with their costs (in place)."""
    named = sorted(named, key=lambda n: (-round(n.cost, 6), n.rank))  # tied ranks in rank order
    kinds = {n.kind for n in named}
    rep.kind = kinds.pop() if len(kinds) == 1 else "mixed"
    rep.ranks = [n.rank for n in named]
    rep.recurrent_ranks = [n.rank for n in named if n.kind == "persistent"]
    rep.intermittent_ranks = [n.rank for n in named if n.kind == "intermittent"]
    rep.lost_fraction = lost
    if rep.mean_step_time_us:
        rep.est_step_time_us = rep.mean_step_time_us * (1.0 - lost)
    share = {n.rank: n.cost / max(lost, 1e-12) for n in named}
    late = {n.rank: len(n.late_steps) for n in named}
    if rep.per_rank.height and {"lost_share", "late_steps"} <= set(rep.per_rank.columns):
        rep.per_rank = rep.per_rank.with_columns(
            lost_share=pl.col("rank").replace_strict(share, default=None, return_dtype=pl.Float64),
            late_steps=pl.col("rank").replace_strict(
                late, default=pl.col("late_steps"), return_dtype=pl.Int64
            ),
        )
    rep.hosts.update({r: None for r in rep.ranks if r not in rep.hosts})
    rep.causes = {n.rank: rank_cause(bd, n.rank, n.late_steps) for n in named}
    rep.cause = "; ".join(f"rank {r}: {c['text']}" for r, c in rep.causes.items())
    rep.reason = (
        f"the replay over the job's process groups and pipeline transfers: idealising ranks "
        f"{rep.ranks} recovers {100 * recovered:.0f}% of the slowdown (the ranks that "
        "waited for them are not named)"
    )


def _faithful(wi: WhatIfReport) -> bool:
    """The replay can overrule the rules: it names ranks, reproduces every step time within
    ``MAX_FIDELITY_ERROR``, and its set recovers ``GROUP_RECOVERED`` of the slowdown."""
    recovered = GROUP_RECOVERED <= wi.recovered_fraction <= 1.0 / GROUP_RECOVERED
    return bool(wi.explaining_set) and wi.fidelity <= MAX_FIDELITY_ERROR and recovered


def as_replay_straggler(
    rep: StragglerReport, wi: WhatIfReport, bd: pl.DataFrame, th: StragglerThresholds
) -> bool:
    """When the rules read no straggler but a faithful replay (``_faithful``) names ranks that
    each cost ``min_intermittent_lost_fraction`` of step time and were late in
    ``MIN_RECURRING`` steps or more, the replay's ranks are the verdict (in place; True when
    done): the bar a replay rank clears to join named ones (``_joining``), here with nobody named.

    Why: the rules' noise is estimated from the arrivals themselves, so with few ranks a
    straggler's own stalls inflate it (a 2-rank job stalling 330-390 ms in 4 of 10 steps read a
    noise sigma of 61 ms and ``none``); the replay measures each rank's work against the typical
    peer's instead, and a job with no straggler leaves its explaining set empty."""
    named = wi.explaining_set
    if rep.kind != "none" or rep.skew_fraction is None or not _faithful(wi):
        return False
    floor = th.min_intermittent_lost_fraction
    if wi.kind not in ("persistent", "intermittent", "mixed") or wi.lost_fraction < th.min_lost_fraction:
        return False  # what a verdict must save (``min_lost_fraction``) holds for the replay too
    kinds = _kinds_by_rules(rep)
    if any(_bar_cost(n, kinds) < floor or len(n.late_steps) < MIN_RECURRING for n in named):
        return False
    _adopt(rep, wi, bd, list(named), wi.lost_fraction, wi.recovered_fraction)
    rep.reason = (
        f"the replay: idealising ranks {rep.ranks} recovers {100 * wi.recovered_fraction:.0f}% of a "
        f"slowdown of {wi.slowdown:.2f}x (the arrivals alone read the stalls as noise)"
    )
    return True


def as_isolated_stalls(rep: StragglerReport, wi: WhatIfReport, th: StragglerThresholds) -> bool:
    """An ``intermittent`` verdict whose every rank stalled in fewer than ``MIN_RECURRING``
    steps (by the rules' count), none of them named for a slow link, becomes ``none`` when the
    replay reproduces every step time (``MAX_FIDELITY_ERROR``) of a trace long enough to show
    recurrence and finds nothing but the host's noise: no rank of its explaining set was late
    in ``MIN_RECURRING`` steps or stalled (``NamedRank.stalled``: alone cost a quarter of a
    step at least once), fixing them all saves under ``min_intermittent_lost_fraction`` of
    step time (what an intermittent verdict must save: delays at a few collectives of a step
    can add up to more without one of them costing a quarter of it), and no pipeline replica
    that explains the slowdown was late in ``MIN_RECURRING`` steps (in place; True when done).

    Why: a host that holds up one rank for a moment holds up every rank that waits for it in
    that step, so one event reads as several ranks each late once (on a pipeline, the stalled
    rank's whole replica; a loaded host's heavy-stage job named six ranks for two such
    events). The rules count each (rank, step) as a stall and charge every late arrival to the
    step; the replay propagates the delay through the groups and the transfers and finds it
    hidden in the other ranks' waits, or in a rank the host held back by 10-15 % of a step once
    or twice, as a loaded host does now and then. Ranks that recur, or stall, are kept whatever
    the replay says. It comes before the pipeline's replica and group-set readings, which
    would otherwise name the ranks such an event held back."""
    if rep.kind != "intermittent" or not rep.ranks:
        return False
    if wi.fidelity > MAX_FIDELITY_ERROR or wi.steps < MIN_RECURRING:
        return False
    if any(n.stalled() or len(n.late_steps) >= MIN_RECURRING for n in wi.explaining_set):
        return False
    if wi.lost_fraction >= th.min_intermittent_lost_fraction:
        return False
    replica = wi.replica
    if replica is not None and replica.explains and len(replica.late_steps) >= MIN_RECURRING:
        return False
    late = rep.per_rank_column("late_steps")
    if any(_named_for_link(rep, r) or int(late.get(str(r)) or 0) >= MIN_RECURRING for r in rep.ranks):
        return False
    named = list(rep.ranks)
    rep.kind = "none"
    rep.ranks, rep.recurrent_ranks, rep.intermittent_ranks = [], [], []
    rep.causes, rep.cause = {}, ""
    _set_roles(rep, dict.fromkeys(named, None), clear=False)
    rep.reason = (
        f"rank(s) {named} each stalled in fewer than {MIN_RECURRING} steps, and the replay, which "
        f"reproduces every step, finds no rank late in {MIN_RECURRING} steps or more, nor one that alone "
        f"cost {100 * STALL_COST:.0f}% of a step, and fixing the ranks it finds saves "
        f"{100 * wi.lost_fraction:.1f}% of step time (the job is {100 * (wi.slowdown - 1.0):.1f}% slower "
        "than its ideal): the host's occasional delays, passed on to the ranks that waited, not a straggler"
    )
    return True


def _prune(rep: StragglerReport, wi: WhatIfReport, th: StragglerThresholds) -> None:
    """Ranks the rules named that a faithful replay leaves out of its explaining set, that were
    not late in most steps (fewer than ``MIN_RECURRING``, or half of the steps or fewer), and
    that cost less than ``min_intermittent_lost_fraction`` of step time both by the rules'
    what-if and alone on the replay's ideal job (``per_rank``, which shows a rank a bigger one
    masks), are not named (in place): the bar a replay rank clears to join (``_joining``),
    applied to the rules' ranks. A rank late in most steps stays: with two slow ranks of three
    the typical peer is itself slow and both what-ifs read the second one as free; unless it
    synchronises in two process groups or more and its own work exceeds the typical peer's by
    less than ``min_intermittent_lost_fraction`` of step time more than the median rank's does
    (``WhatIfReport.excess_work``): it was late only because it waited for a named rank in a
    group they share (with rank 5 of a tensor-parallel group slowed, ranks 4, 6 and 7 wait for
    it there, then reach their data-parallel all-reduces last). So does a
    rank named for its late collective ends (a slow link): its cost is in the transfer. A
    verdict keeps at least one rank. (Ranks a loaded host keeps a little behind the others
    together, last in a third of the steps by a millisecond, are what this drops most often.)

    Faithful here: ``_faithful``, or, beside a rank named for a slow link, an empty explaining
    set from a replay that reproduces every step time: no rank's work saves ``search.MIN_GAIN``,
    the slowdown is in the link's transfers, and the ranks its late ends make arrive late next
    are its echo. (Without a slow link an empty set only says the slowdown is small: a replica
    slowed as a whole costs little rank by rank, and its ranks stay.)"""
    link = any(_named_for_link(rep, r) for r in rep.ranks)
    if not (_faithful(wi) or (link and not wi.explaining_set and wi.fidelity <= MAX_FIDELITY_ERROR)):
        return
    floor = th.min_intermittent_lost_fraction
    kept = set(wi.ranks())
    late, kinds = rep.per_rank_column("late_steps"), _kinds_by_rules(rep, wi.steps)

    def cheap(r: int) -> bool:
        if _named_for_link(rep, r):
            return False  # its cost is its late ends (the transfer): no arrival what-if sees it
        alone = wi.per_rank.get(str(r), 1.0) - 1.0
        if r in kept or alone >= floor:
            return False
        if kept and wi.excess_work.get(str(r), floor) < floor:  # beyond the median rank's
            return True  # its own work is typical: late only by waiting (an echo of the set)
        rare = int(late.get(str(r)) or 0) < MIN_RECURRING or kinds.get(r) != "persistent"
        return rare and _ruled_cost(rep, r) < floor

    drop = {r for r in rep.ranks if cheap(r)}
    if not drop or drop >= set(rep.ranks):
        return
    rep.ranks = [r for r in rep.ranks if r not in drop]
    rep.recurrent_ranks = [r for r in rep.recurrent_ranks if r not in drop]
    rep.intermittent_ranks = [r for r in rep.intermittent_ranks if r not in drop]
    if rep.kind == "mixed" and not (rep.recurrent_ranks and set(rep.intermittent_ranks) & set(rep.ranks)):
        rep.kind = "persistent" if rep.recurrent_ranks else "intermittent"
    rep.causes = {r: c for r, c in rep.causes.items() if r not in drop}
    rep.cause = "; ".join(f"rank {r}: {c['text']}" for r, c in rep.causes.items())
    _set_roles(rep, dict.fromkeys(drop, None), clear=False)
    groups = rep.groups
    rep.groups = [g for g in groups if not set(g.get("ranks") or ()) & drop]
    many = len(drop) > 1
    rep.reason += (
        f"; not named: rank{'s' if many else ''} {', '.join(map(str, sorted(drop)))} ({'each ' if many else ''}"
        f"under {100 * floor:.0f}% of step time by both what-ifs, or late only by waiting for the named)"
    )
    if groups and not rep.groups:
        _persistent_when_alone(rep)


def _named_for_link(rep: StragglerReport, r: int) -> bool:
    """Rank ``r`` is named for its late collective ends (a slow link, ``stragglers.slow_link``)."""
    return bool((rep.causes.get(r) or {}).get("explained_by") == "slow_link")


def _persistent_when_alone(rep: StragglerReport) -> None:
    """An intermittent verdict whose late-together groups were all dropped (``_prune``), left
    with ranks each late in most steps (``kinds.rank_kind``: more than half, or a one-step
    trace's only step), is persistent: the group was what made it intermittent. (A verdict that
    was intermittent without a group keeps its kind: its ranks' own stalls made it so.)"""
    kinds = _kinds_by_rules(rep)
    alone = all(kinds.get(r) == "persistent" for r in rep.ranks)
    if rep.kind != "intermittent" or not alone:
        return
    rep.kind = "persistent"
    rep.intermittent_ranks = []
    rep.pattern = "steady" if rep.pattern == "bursts" else rep.pattern
    _set_roles(rep, dict.fromkeys(rep.ranks, "persistent"), clear=False)


def _joining(rep: StragglerReport, wi: WhatIfReport, th: StragglerThresholds) -> list[int]:
    """Ranks of the replay's explaining set that join the named ones (``reconcile``)."""
    floor = th.min_intermittent_lost_fraction
    ruled = rep.per_rank_column("late_steps")  # the rules' count, for the ranks they named intermittent

    def recurs(n: NamedRank) -> bool:
        by_rules = (ruled.get(str(n.rank)) or 0) if n.rank in rep.intermittent_ranks else 0
        return max(len(n.late_steps), by_rules) >= min(MIN_RECURRING, wi.steps)

    cheapest = min((n.cost for n in wi.explaining_set if n.rank in rep.ranks), default=None)
    kinds = _kinds_by_rules(rep)

    def outweighs(n: NamedRank) -> bool:  # a trace too short to show recurrence: cost decides
        return wi.steps < MIN_RECURRING and cheapest is not None and n.cost >= cheapest

    return [
        n.rank
        for n in wi.explaining_set
        if n.rank not in rep.ranks and _bar_cost(n, kinds) >= floor and (recurs(n) or outweighs(n))
    ]


def _bar_cost(n: NamedRank, kinds_by_rules: Mapping[int, str]) -> float:
    """The cost a replay rank's floor is held against: its tie's whole saving (``tie_cost``) when
    the tie is a steady one the arrivals confirm, else its own share.

    Why: ranks slowed together (a node, a replica) mask each other, so each carries only its
    part of what fixing them saves (four ranks of a slow node at 4 % each are one problem costing
    16 %). The tie counts as one only when the replay finds the rank late in most steps and the
    arrivals do too (``kinds_by_rules``, ``_kinds_by_rules``: more than half of its steps): a
    pair late together in half the steps is what the host's jitter gives, and a group no
    collective links to the rest is measured against a peer of another role."""
    return n.joint_cost() if n.kind == kinds_by_rules.get(n.rank) == "persistent" else n.cost


def _kinds_by_rules(rep: StragglerReport, steps_if_unknown: int = 0) -> dict[int, str]:
    """Each rank's kind by the rules' own count of its late steps (``kinds.rank_kind`` of the
    per-rank table's ``late_steps`` of ``steps``; ``steps_if_unknown`` where it has none)."""
    late, steps = rep.per_rank_column("late_steps"), rep.per_rank_column("steps")
    return {int(r): rank_kind(int(n or 0), int(steps.get(r) or steps_if_unknown)) for r, n in late.items()}


def _join(
    rep: StragglerReport,
    wi: WhatIfReport,
    bd: pl.DataFrame,
    named_roles: dict[int, str],
    extra: list[int],
    th: StragglerThresholds,
) -> None:
    """Add ``extra`` to the named ranks; ``mixed`` when both kinds are among them."""
    costs = {n.rank: n for n in wi.explaining_set}
    rep.ranks = rep.ranks + extra
    rep.intermittent_ranks = [r for r in rep.intermittent_ranks if r not in extra]
    short = wi.steps < MIN_RECURRING  # too few steps for the rules' tests: the kinds' own definition
    if wi.steps == 1:  # one step tells no kind: the rules' collectives do (``_kinds_by_collectives``)
        roles = _kinds_by_collectives(rep, th)
    elif short:
        late = rep.per_rank_column("late_steps")
        seen = {r: len(n.late_steps) for r, n in costs.items()}
        roles = {r: rank_kind(max(int(late.get(str(r)) or 0), seen.get(r, 0)), wi.steps) for r in rep.ranks}
    else:  # a rank the replay adds has the replay's kind
        roles = {r: costs[r].kind if r in extra else named_roles.get(r) or "intermittent" for r in rep.ranks}
    kinds = set(roles.values())
    if len(kinds) > 1:
        rep.kind = "mixed"
    elif short:
        rep.kind = kinds.pop()
    rep.intermittent_ranks += [r for r in extra if roles[r] == "intermittent"]  # named, not persistent
    rep.hosts.update({r: None for r in extra if r not in rep.hosts})
    _set_roles(rep, roles if short else {r: roles[r] for r in extra}, clear=False)
    for r in extra:
        rep.causes.setdefault(r, rank_cause(bd, r, costs[r].late_steps))
    _set_late(rep, {r: len(costs[r].late_steps) for r in extra}, at_least=True)
    rep.cause = "; ".join(f"rank {r}: {c['text']}" for r, c in rep.causes.items() if r in rep.ranks)


def _set_late(rep: StragglerReport, late: Mapping[int, int], at_least: bool = False) -> None:
    """The per-rank table's ``late_steps`` of these ranks set to the replay's count (``at_least``:
    raised to it where the rules counted fewer, so a rank the replay names is never shown late
    in 0 steps)."""
    if not late or not rep.per_rank.height or "late_steps" not in rep.per_rank.columns:
        return
    seen = pl.col("rank").replace_strict(dict(late), default=pl.col("late_steps"), return_dtype=pl.Int64)
    if at_least:
        seen = pl.max_horizontal(pl.col("late_steps").fill_null(0), seen)
    rep.per_rank = rep.per_rank.with_columns(late_steps=seen)


def _kinds_by_collectives(rep: StragglerReport, th: StragglerThresholds) -> dict[int, str]:
    """The kinds of the named ranks of a one-step trace, whose only step every named rank is late
    in: judged over the step's collectives instead. ``persistent`` when the rank is last at more
    of them than chance gives one rank (the table's ``p_value`` under ``alpha``): late again and
    again through the step; ``intermittent`` when it is not, its lateness a stall at a few of
    them."""
    p = rep.per_rank_column("p_value")
    return {r: "persistent" if float(p.get(str(r)) or 1.0) < th.alpha else "intermittent" for r in rep.ranks}


def _set_roles(rep: StragglerReport, roles: Mapping[int, str | None], clear: bool) -> None:
    """The per-rank table's ``role`` of these ranks (``clear``: every other rank's emptied)."""
    if "role" not in rep.per_rank.columns or not roles:
        return
    keep = pl.lit(None, dtype=pl.String) if clear else pl.col("role")
    role = pl.col("rank").replace_strict(roles, default=None, return_dtype=pl.String)
    rep.per_rank = rep.per_rank.with_columns(
        pl.when(pl.col("rank").is_in(list(roles))).then(role).otherwise(keep).alias("role")
    )


def _as_rotating(rep: StragglerReport, bd: pl.DataFrame, moving: list[NamedRank], ruled: list[int]) -> None:
    """The verdict ``rotating``: every rank of the replay's set that stalled (``moving``), with
    its cost, and the ranks the rules named for their stalls (``ruled``: each too cheap alone for
    the replay's set, one stall in many steps), with what the rules say fixing it saves."""
    late = rep.per_rank_column("late_steps")
    rep.kind = "rotating"
    rep.ranks = [n.rank for n in moving] + ruled
    rep.intermittent_ranks = list(rep.ranks)
    rep.lost_fraction = _rotating_cost(rep, moving, ruled)
    if rep.mean_step_time_us:
        rep.est_step_time_us = rep.mean_step_time_us * (1.0 - rep.lost_fraction)
    rep.hosts = {r: rep.hosts.get(r) for r in rep.ranks}
    _set_roles(rep, dict.fromkeys(rep.ranks, "rotating"), clear=True)
    causes = {n.rank: rank_cause(bd, n.rank, n.late_steps) for n in moving}
    rep.causes = causes | {r: rep.causes.get(r) or rank_cause(bd, r, None) for r in ruled}
    rep.cause = "; ".join(f"rank {r}: {c['text']}" for r, c in rep.causes.items())
    rep.reason = (
        f"the replay finds stalls moving between ranks {rep.ranks} (each late in only a few "
        f"steps: {', '.join(f'rank {r}: {late.get(str(r)) or 0}' for r in rep.ranks)}), together "
        f"costing {100 * rep.lost_fraction:.1f}% of step time"
    )


def _rotating_cost(rep: StragglerReport, moving: list[NamedRank], ruled: list[int]) -> float:
    """What a ``rotating`` verdict's ranks cost together, as a share of the mean step: each
    replay rank's share of its what-if, each rank only the rules named by their what-if."""
    return float(sum(n.cost for n in moving) + sum(_ruled_cost(rep, r) for r in ruled))


def _ruled_cost(rep: StragglerReport, r: int) -> float:
    """What fixing rank ``r`` saves by the rules' what-if, as a share of the mean step."""
    saving = rep.per_rank_column("whatif_saving(us)").get(str(r)) or 0.0
    return float(saving) / rep.mean_step_time_us if rep.mean_step_time_us else 0.0


def rotating_line(rep: StragglerReport, wi: dict[str, Any]) -> str:
    """The headline of a ``rotating`` verdict: every named rank with its own cost and steps."""
    named = {n["rank"]: n for n in wi.get("explaining_set", [])}
    late = rep.per_rank_column("late_steps")
    segs = [
        f"rank {r}: {100 * named[r]['cost']:.1f}% of step time (late in steps {named[r]['late_steps']})"
        if r in named
        else f"rank {r}: {100 * _ruled_cost(rep, r):.1f}% of step time (late in {late.get(str(r)) or 0} steps)"
        for r in rep.ranks
    ]
    return (
        f"ROTATING STRAGGLERS: the slowdown moves between {len(segs)} ranks, costing "
        f"{100 * (rep.lost_fraction or 0.0):.1f}% of step time together; " + "; ".join(segs) + "."
    )
