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
    ``|union over its instances of [m_i, L_i]|``; what the set saves in a step is that waiting
    minus the waiting with ``S`` fixed. ``lost_fraction = saved(named ranks) / sum of step
    times``; ``skew_fraction = waiting / sum of step times`` (perfect synchrony).
chance of being last
    ``p0 = mean |G_i| / N'`` (``N'``: the ranks not yet named); ``p_value`` = one-sided binomial ``P(X >= k)`` for a rank in the
    last group at ``k`` of ``n`` instances.
naming (greedy what-if over sets)
    round by round, with the ranks named so far fixed (what-if), the rank imposing the most wait
    is named when **either** (a) it is last far more often than chance (``p_value < alpha``) and
    its imposed wait without its largest step (one step: instance) is at least
    ``min_rank_effect`` of the step time and ``min_share`` of the
    round's imposed wait (frequency: host load does not hide a rank that is last every time),
    **or** (b) its imposed wait in some step reaches the event threshold (magnitude: a one-off
    stall far beyond the arrival noise). The loop stops at the first round whose best candidates
    all fail. Ranks named for (b) alone need ``min_events`` events job-wide (one stall is no
    pattern).
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
    of the step time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl


@dataclass(frozen=True)
class StragglerThresholds:
    """Every threshold of the straggler verdict (docs/diagnosis.md §5)."""

    k_sigma: float = 8.0
    rel_step: float = 0.05
    rel_step_intermittent: float = 0.25
    first_step_factor: float = 2.0
    persistent_noise_cap: float = 1.0
    rel_to_worst: float = 0.5
    abs_floor_us: float = 100.0
    min_lost_fraction: float = 0.015
    min_jitter_lost_fraction: float = 0.05
    min_events: int = 2
    persistent_share: float = 0.5
    recurrent_concentration: float = 0.6
    min_steps_confident: int = 4
    alpha: float = 0.02
    min_rank_effect: float = 0.01
    min_share: float = 0.2
    tie_us: float = 0.5
    spike_factor: float = 4.0
    max_named: int = 8
    link_floor_us: float = 50.0
    link_min_ranks: int = 3


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
    kind: str = "none"  # persistent | intermittent | none
    ranks: list[int] = field(default_factory=list)
    hosts: dict[int, str | None] = field(default_factory=dict)
    recurrent_ranks: list[int] = field(default_factory=list)
    intermittent_ranks: list[int] = field(default_factory=list)
    lost_fraction: float | None = None
    skew_fraction: float | None = None
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
    total_imposed_us: float = 0.0
    per_rank: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=PER_RANK_SCHEMA))
    per_step: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=PER_STEP_SCHEMA))
    thresholds: StragglerThresholds = field(default_factory=StragglerThresholds)

    def rank_row(self, r: int) -> dict[str, Any]:
        """The per-rank row of rank ``r`` (empty dict when absent)."""
        rows = self.per_rank.filter(pl.col("rank") == r)
        return rows.row(0, named=True) if rows.height else {}

    def to_dict(self) -> dict[str, Any]:
        from kinetoscope.diagnosis.report import frame_rows  # local: report imports this module

        speedup = None
        if self.mean_step_time_us and self.est_step_time_us:
            speedup = self.mean_step_time_us / self.est_step_time_us
        pr = self.per_rank
        col = (lambda c: dict(zip(map(str, pr["rank"].to_list()), pr[c].to_list(), strict=True))) if pr.height else (lambda c: {})
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
            "what_if": {
                "mean_step_time_us": self.mean_step_time_us,
                "est_step_time_without_stragglers_us": self.est_step_time_us,
                "speedup": speedup,
            },
            "next_ranks": list(self.next_ranks),
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
            "thresholds": {k: getattr(th, k) for k in th.__dataclass_fields__},
            "per_rank": frame_rows(self.per_rank),
            "per_step": frame_rows(self.per_step),
        }


# ---- small numeric helpers ---------------------------------------------------------------------------


def binom_sf(k: int, n: int, p: float) -> float:
    """One-sided binomial test: ``P(X >= k)`` for ``X ~ Binomial(n, p)`` (log-space sum)."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    base = math.lgamma(n + 1)
    terms = [base - math.lgamma(j + 1) - math.lgamma(n - j + 1) + j * lp + (n - j) * lq for j in range(k, n + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def union_by_group(groups: np.ndarray, starts: np.ndarray, ends: np.ndarray, n_groups: int) -> np.ndarray:
    """Length of the union of ``[start, end)`` per group id (``0..n_groups-1``); empty intervals
    are ignored."""
    out = np.zeros(n_groups, dtype=np.float64)
    ok = ends > starts
    if not ok.any():
        return out
    g, s, e = groups[ok], starts[ok].astype(np.float64), ends[ok].astype(np.float64)
    order = np.lexsort((s, g))
    g, s, e = g[order], s[order], e[order]
    cut = np.flatnonzero(np.diff(g)) + 1
    for gs, ss, es in zip(np.split(g, cut), np.split(s, cut), np.split(e, cut), strict=True):
        run = np.maximum.accumulate(es)
        prev = np.concatenate(([-np.inf], run[:-1]))
        out[gs[0]] = float(np.clip(es - np.maximum(ss, prev), 0, None).sum())
    return out


def noise_sigma(instances: pl.DataFrame) -> float:
    """Arrival jitter (ns): ``1.4826 x`` the median, over all (rank, instance), of the absolute
    deviation of the rank's skew from its own median skew, where a skew is the arrival minus the
    instance's *median* arrival. Centering on each rank's median removes a persistent straggler's
    steady offset; pooling the ranks and using the median arrival keeps the estimate defined
    with two ranks (the lower-median skew of the earlier of two ranks is always 0)."""
    inst = instances.filter(pl.col("n_ranks") > 1)
    if inst.is_empty():
        return 0.0
    dev = (
        inst.with_columns(s=(pl.col("arrival") - pl.col("arrival").median().over("instance")).cast(pl.Float64))
        .with_columns(c=(pl.col("s") - pl.col("s").median().over("rank")).abs())
    )["c"]
    return float(1.4826 * float(dev.median())) if dev.len() else 0.0  # type: ignore[arg-type]


# ---- the instance matrix and one what-if round -------------------------------------------------------------


@dataclass
class _Matrix:
    """Complete instances as arrays: ``A[i, j]`` arrival (ns) of rank ``ranks[j]`` at instance
    ``i``; ``step_idx[i]`` index into ``steps``; ``m[i]`` typical arrival."""

    ranks: list[int]
    steps: list[int]
    A: np.ndarray
    step_idx: np.ndarray
    m: np.ndarray
    E: np.ndarray | None = None  # collective end (ns) per [instance, rank], same order as A


def _matrix(inst: pl.DataFrame, ranks: list[int], steps: list[int]) -> tuple[_Matrix, int]:
    """The complete-instance matrix, and how many partial instances were left out."""
    n = len(ranks)
    per = inst.group_by("instance").agg(pl.len().alias("_n"), pl.col("step").first())
    complete = per.filter(pl.col("_n") == n)
    partial = per.height - complete.height
    sub = inst.filter(pl.col("instance").is_in(complete["instance"].implode()))
    wide = sub.pivot(on="rank", index=["instance", "step"], values="arrival", aggregate_function="first").sort(
        "step", "instance")
    if wide.is_empty():
        return _Matrix(ranks, steps, np.zeros((0, n), np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)), partial
    A = np.column_stack([wide[str(r)].to_numpy().astype(np.int64) for r in ranks])
    order = np.argsort(A, axis=1, kind="stable")
    srt = np.take_along_axis(A, order, axis=1)
    m = srt[:, (n - 1) // 2]
    pos = {s: k for k, s in enumerate(steps)}
    step_idx = np.array([pos[s] for s in wide["step"].to_list()], dtype=np.int64)
    E = None
    if "end" in sub.columns:
        ew = sub.pivot(on="rank", index=["instance", "step"], values="end", aggregate_function="first").sort(
            "step", "instance")
        E = np.column_stack([ew[str(r)].to_numpy().astype(np.int64) for r in ranks])
    return _Matrix(ranks, steps, A, step_idx, m, E), partial


@dataclass
class _Round:
    """Attribution with the set ``fixed`` arriving like the typical rank."""

    last: np.ndarray  # bool [inst, rank]: in the last group
    imposed: np.ndarray  # float [inst, rank] (ns)
    step_imposed: np.ndarray  # float [step, rank] (ns): union per step
    waiting: np.ndarray  # float [step] (ns): union of [m, L]
    p0: float
    free: int  # ranks not fixed: the chance of being last is 1 / free without ties


def _round(mx: _Matrix, fixed: set[int], tie_ns: float) -> _Round:
    n_inst, n = mx.A.shape
    A = _fixed_arrivals(mx, fixed)
    L = A.max(axis=1)
    last = A >= (L - tie_ns)[:, None]
    last[:, [j for j, r in enumerate(mx.ranks) if r in fixed]] = False  # a fixed rank is never waited for
    last[last.all(axis=1)] = False  # all ranks arrived together: nobody was waited for
    others = np.where(last, -np.inf, A).max(axis=1)
    others = np.where(np.isfinite(others), others, mx.m.astype(np.float64))
    size = last.sum(axis=1)
    imposed = np.where(last, ((L - others) / np.maximum(size, 1))[:, None], 0.0)
    n_steps = len(mx.steps)
    step_imposed = np.zeros((n_steps, n))
    for j in range(n):
        step_imposed[:, j] = union_by_group(mx.step_idx, L - imposed[:, j], L, n_steps)
    waiting = union_by_group(mx.step_idx, mx.m.astype(np.float64), L, n_steps)
    free = max(n - len(fixed & set(mx.ranks)), 1)  # fixed ranks arrive like the typical rank: never last
    p0 = float(size.mean()) / free if n_inst and size.any() else 1.0 / free
    return _Round(last, imposed, step_imposed, waiting, min(p0, 1.0), free)


def _fixed_arrivals(mx: _Matrix, fixed: set[int]) -> np.ndarray:
    """Arrivals (float ns) with each rank of ``fixed`` arriving no later than the typical rank
    of the others: the lower median of the ranks not fixed. With few ranks the median of all
    ranks can be a second straggler's arrival (3 ranks, 2 late): fixing one straggler at it
    would leave it tied last with the other instead of arriving like the punctual ranks."""
    A = mx.A.astype(np.float64).copy()
    cols = [j for j, r in enumerate(mx.ranks) if r in fixed]
    free = [j for j in range(A.shape[1]) if j not in cols]
    if not cols or A.shape[0] == 0:
        return A
    # every rank fixed: all arrive like the typical rank of the job (nobody waits)
    typ = np.sort(A[:, free], axis=1)[:, (len(free) - 1) // 2] if free else mx.m.astype(np.float64)
    A[:, cols] = np.minimum(A[:, cols], typ[:, None])
    return A


def _waiting_fixed(mx: _Matrix, fixed: set[int]) -> np.ndarray:
    """Per step: waiting ``|union [m, L]|`` with ``fixed`` arriving like the typical rank."""
    A = _fixed_arrivals(mx, fixed)
    return union_by_group(mx.step_idx, mx.m.astype(np.float64), A.max(axis=1), len(mx.steps))


# ---- slow link: a rank whose collectives end late -------------------------------------------------------


@dataclass
class _SlowLink:
    """End-skew evidence of one rank (``_slow_link``); times in ns."""

    rank: int
    late: int  # instances where it ended beyond the threshold after its peers
    events: int  # instances where any rank did
    instances: int
    world: int
    p: float
    excess_ns: float  # summed end excess at its late instances
    threshold_ns: float
    late_steps: np.ndarray  # bool [step]
    per_step_ns: np.ndarray  # float [step]: its end excess per step


def end_skew(mx: _Matrix) -> np.ndarray:
    """``S[i, j]``: rank ``j``'s collective end at instance ``i`` minus the median end of the
    instance's ranks (ns)."""
    assert mx.E is not None
    return mx.E.astype(np.float64) - np.median(mx.E.astype(np.float64), axis=1)[:, None]


def _slow_link(mx: _Matrix, th: StragglerThresholds, total_T: float, skip: set[int]) -> list[_SlowLink]:
    """Ranks whose collectives end late after their peers' (slow link / its collectives'
    transfer), most excess first.

    A rank is named when it ends beyond ``max(k_sigma x sigma_end, link_floor_us)`` after the
    instance's median end (``sigma_end`` = 1.4826 x MAD of all end skews) at ``late`` of the
    ``events`` instances where some rank did, far more often than chance (binomial against
    ``1/N``: ``p < alpha``), at ``min_events`` instances or more, and its summed end excess is
    at least ``rel_step`` of the summed step time. Needs ``link_min_ranks`` ranks: with two
    ranks and unknown clocks, the clocks are aligned on collective ends, so a late end is
    indistinguishable from a clock offset, and the median end is not a peer's end."""
    n_inst, n = mx.A.shape
    if mx.E is None or n < th.link_min_ranks or n_inst == 0 or total_T <= 0:
        return []
    S = end_skew(mx)
    sigma = 1.4826 * float(np.median(np.abs(S - np.median(S))))
    thr = max(th.k_sigma * sigma, th.link_floor_us * 1000.0)
    late = S >= thr
    events = int(late.any(axis=1).sum())
    out = []
    for j, r in enumerate(mx.ranks):
        k = int(late[:, j].sum())
        if r in skip or k < th.min_events:
            continue
        p = binom_sf(k, events, 1.0 / n)
        excess = float(S[late[:, j], j].sum())
        if p < th.alpha and excess >= th.rel_step * total_T:
            per_step = np.bincount(mx.step_idx[late[:, j]], weights=S[late[:, j], j], minlength=len(mx.steps))
            out.append(_SlowLink(r, k, events, n_inst, n, p, excess, thr, per_step > 0, per_step))
    return sorted(out, key=lambda x: -x.excess_ns)


def link_cause(sl: _SlowLink, n_steps: int, total_T: float) -> dict[str, Any]:
    """The cause record (``rank_cause`` shape) of a rank named for its late collective ends."""
    per_step = sl.excess_ns / max(n_steps, 1) / 1e6
    return {
        "lateness_ms_per_step": round(per_step, 3),
        "components": {"slow_link": {"late_ends": sl.late, "instances": sl.instances, "excess_ms": round(per_step, 3),
                                     "share_of_step": round(sl.excess_ns / total_T, 4), "p_value": sl.p,
                                     "threshold_ms": round(sl.threshold_ns / 1e6, 3)}},
        "explained_by": "slow_link",
        "text": (f"slow link / its collectives' transfer: its collectives end {per_step:.1f} ms per step after "
                 f"its peers' ({100 * sl.excess_ns / total_T:.1f}% of step time), beyond "
                 f"{sl.threshold_ns / 1e6:.2f} ms at {sl.late}/{sl.instances} collectives "
                 f"({sl.late} of the {sl.events} late ends, p={sl.p:.2g})"),
    }


# ---- the analysis ----------------------------------------------------------------------------------------


@dataclass
class _Named:
    rank: int
    freq: bool
    events: int
    big_steps: int
    late: np.ndarray  # bool [step]
    rnd: _Round
    p: float
    k: int
    partner: int | None = None  # named as a pair with this rank (judged jointly)
    link: _SlowLink | None = None  # its late collective ends (slow link evidence)
    by_link: bool = False  # named for its late ends alone (not for its arrivals)
    alone_late: np.ndarray | None = None  # bool [step]: late with the other named ranks fixed
    alone_imposed: np.ndarray | None = None  # float [step] (ns): its imposed wait with them fixed


def analyze_stragglers(
    instances: pl.DataFrame,
    breakdown: pl.DataFrame,
    hosts: dict[int, str | None] | None = None,
    thresholds: StragglerThresholds | None = None,
    first_step: int | None = None,
    dropped_steps: int = 0,
) -> StragglerReport:
    """The straggler verdict (module docstring). ``first_step``: the label of a trace-start
    delimited first step included in the analysis (its thresholds are ``first_step_factor``
    times the others: it carries the profiler's start-up); ``dropped_steps``: steps left out
    because not every rank holds them (reported)."""
    th = thresholds or StragglerThresholds()
    hosts = hosts or {}
    rep = StragglerReport(thresholds=th, dropped_steps=dropped_steps)
    inst = instances.filter(pl.col("step").is_not_null() & (pl.col("n_ranks") > 1))
    ranks = sorted(set(breakdown["rank"].to_list())) if breakdown.height else []
    if len(ranks) < 2 or inst.is_empty():
        if not ranks:
            rep.reason = "no steps found: nothing to compare"
        elif len(ranks) < 2:
            rep.reason = "single rank: stragglers need at least two ranks"
        else:
            rep.reason = "no collective matched across ranks: no arrival skew to measure"
        rep.per_rank = _per_rank(breakdown, hosts, None, None, {})
        return rep
    steps = sorted(set(inst["step"].to_list()) & set(breakdown["step"].to_list()))
    bd = breakdown.filter(pl.col("step").is_in(steps))
    inst = inst.filter(pl.col("step").is_in(steps) & pl.col("rank").is_in(ranks))
    mx, rep.partial_instances = _matrix(inst, ranks, steps)
    rep.instances = int(mx.A.shape[0])
    T = bd.group_by("step").agg(pl.col("step_time(us)").median().alias("T")).sort("step")
    T_ns = np.array([float(T.filter(pl.col("step") == s)["T"][0]) * 1000.0 for s in steps])
    total_T = float(T_ns.sum())
    rep.steps_analysed = len(steps)
    if rep.instances == 0:
        rep.reason = "no collective instance reached by every rank: no arrival order to compare"
        rep.per_rank = _per_rank(bd, hosts, None, None, {})
        return rep
    r0 = _round(mx, set(), th.tie_us * 1000.0)
    factor = np.array([th.first_step_factor if s == first_step else 1.0 for s in steps])
    sigma, thr_p, thr_i = _noise_thresholds(inst, steps, r0, T_ns, factor, th)
    rep.sigma_us = sigma / 1000.0
    rep.total_imposed_us = float(r0.imposed.sum()) / 1000.0

    named = _name_ranks(mx, r0, th, total_T, thr_p, thr_i, sigma)
    per_step_late = {nm.rank: nm.late for nm in named}
    events_total = sum(nm.events for nm in named if not nm.freq)
    if events_total < th.min_events:  # one stall of one rank is not a pattern
        isolated = [nm for nm in named if not nm.freq]
        named = [nm for nm in named if nm.freq]
        if isolated:
            s = steps[int(np.flatnonzero(isolated[0].late)[0])] if isolated[0].late.any() else steps[0]
            rep.reason = f"one isolated late arrival (rank {isolated[0].rank}, step {s}) is not a pattern"
    links = _slow_link(mx, th, total_T, set())
    by_arrival = {nm.rank: nm for nm in named}
    for sl in links:  # a slow link delays its own ends, not (always) its next arrival
        if sl.rank in by_arrival:
            by_arrival[sl.rank].link = sl
        elif len(named) < th.max_named:
            named.append(_Named(sl.rank, True, 0, 0, sl.late_steps, r0, sl.p, sl.late, link=sl, by_link=True))
    fixed = {nm.rank for nm in named}
    waiting_fixed = _waiting_fixed(mx, fixed)
    excess = np.clip(r0.waiting - waiting_fixed, 0, None)
    if links:  # per step, the larger of the arrival what-if and the late ends (no double count)
        excess = np.minimum(np.maximum(excess, sum(sl.per_step_ns for sl in links)), T_ns)
    rep.skew_fraction = float(r0.waiting.sum()) / total_T if total_T > 0 else None
    rep.lost_fraction = float(excess.sum()) / total_T if total_T > 0 else None
    rep.mean_step_time_us = float(T_ns.mean()) / 1000.0
    rep.est_step_time_us = float((T_ns - excess).mean()) / 1000.0
    n_units_steps = len(steps) >= th.min_steps_confident
    _late_alone(mx, named, thr_p, th)
    persistent, intermittent = [], []
    for nm in named:
        (persistent if _is_persistent(nm, mx, th, n_units_steps) else intermittent).append(nm)
    link_named = [nm for nm in named if nm.by_link]
    # a steady small skew whose time is mostly lost in a few spikes: the spikes are what to fix,
    # reported as intermittent (pattern "steady skew with spikes")
    skew_spikes = [nm for nm in persistent if nm not in link_named and _spike_share(nm, mx, th) >= 0.5]
    persistent = [nm for nm in persistent if nm not in skew_spikes]
    intermittent += skew_spikes
    skew_spikes += [nm for nm in intermittent if nm not in skew_spikes and nm not in link_named and n_units_steps
                    and nm.late.mean() >= th.persistent_share and _spike_share(nm, mx, th) >= 0.5]
    final = _round(mx, fixed, th.tie_us * 1000.0)
    rep.per_step = _per_step(mx, r0, T_ns, excess, thr_i, thr_p, bd, per_step_late)
    rep.straggled_steps = int((rep.per_step["late_ranks"].list.len() > 0).sum())
    rep.confidence = _confidence(rep, th)
    roles = {nm.rank: ("persistent" if nm in persistent else "intermittent") for nm in named}
    rep.per_rank = _per_rank(bd, hosts, mx, {nm.rank: nm for nm in named}, roles, final=final, T_ns=T_ns,
                             lost_share=_lost_shares(mx, [nm.rank for nm in named], r0.waiting))
    if named:
        rep.next_ranks = _next_ranks(mx, final, fixed, T_ns)
    lost = rep.lost_fraction or 0.0
    jitter = _only_jitter(named, persistent, lost, th)
    if not named or lost < th.min_lost_fraction or jitter:
        rep.kind = "none"
        if jitter:
            rep.reason = (
                f"rank(s) {[nm.rank for nm in named]} are last more often than chance, but in under half of the "
                f"steps and with no stall beyond the noise, costing {100 * lost:.1f}% of step time "
                f"(< {100 * th.min_jitter_lost_fraction:g}%): arrival jitter, not a straggler"
            )
        elif named:
            rep.reason = (
                f"rank(s) {[nm.rank for nm in named]} make the others wait, but fixing them would save only "
                f"{100 * lost:.1f}% of step time (< {100 * th.min_lost_fraction:g}%)"
            )
        elif not rep.reason:
            top = int(np.argmax(r0.imposed.sum(axis=0)))
            k = int(r0.last[:, top].sum())
            rep.reason = (
                f"no rank is last far more often than chance or late beyond the noise (most often last: "
                f"rank {mx.ranks[top]} at {k}/{rep.instances} collectives, chance {100 * r0.p0:.0f}%)"
            )
        return rep
    order = named  # naming order: each rank is the one that explained most once the previous were fixed
    if persistent:
        rep.kind = "persistent"
        rep.ranks = [nm.rank for nm in order if nm in persistent]
        rep.intermittent_ranks = [nm.rank for nm in order if nm in intermittent]
    else:
        rep.kind = "intermittent"
        rep.ranks = [nm.rank for nm in order]
        rep.intermittent_ranks = list(rep.ranks)
    rep.pattern = _pattern(persistent, skew_spikes, mx, th)
    counts = {nm.rank: int(nm.late.sum()) for nm in intermittent}
    rep.recurrent_ranks = sorted(
        r for r, c in counts.items() if c >= 3 and c / max(rep.straggled_steps, 1) >= th.recurrent_concentration
    )
    rep.hosts = {r: hosts.get(r) for r in rep.ranks}
    rep.reason = _reason(rep, named)
    late_of = {nm.rank: [mx.steps[k] for k in np.flatnonzero(nm.late)] for nm in named}
    link_of = {nm.rank: nm.link for nm in named if nm.link is not None}
    rep.causes = {r: link_cause(link_of[r], len(steps), total_T) if r in link_of else rank_cause(bd, r, late_of.get(r))
                  for r in rep.ranks}
    rep.cause = "; ".join(f"rank {r}: {c['text']}" for r, c in rep.causes.items())
    return rep


def _only_jitter(named: list[_Named], persistent: list[_Named], lost: float, th: StragglerThresholds) -> bool:
    """True when every named rank is intermittent, named for how often it is last alone (no
    stall beyond the event threshold, no late collective ends), and together they cost less than
    ``min_jitter_lost_fraction`` of the step: on a loaded host one rank is often preempted a
    little more than its peers, which is arrival jitter, not a straggler worth acting on. A
    steady delay (persistent) keeps the lower ``min_lost_fraction`` floor."""
    if not named or persistent or lost >= th.min_jitter_lost_fraction:
        return False
    return all(nm.freq and nm.events == 0 and not nm.by_link and nm.link is None for nm in named)


def _noise_thresholds(
    inst: pl.DataFrame, steps: list[int], r0: _Round, T_ns: np.ndarray, factor: np.ndarray, th: StragglerThresholds
) -> tuple[float, np.ndarray, np.ndarray]:
    """Arrival noise sigma (ns) and, per step, the persistent and event thresholds (ns).

    Frequent stalls inflate sigma (with two ranks every stall moves both skews): the steps with
    a candidate event (half the event threshold's noise term) are left out and sigma measured
    again, once, when they are at most half of the steps. The MAD barely moves when a few steps
    of a clean job are left out; it drops when stalls hit a third of the steps."""
    clean_ref = float(np.median(np.clip(T_ns - r0.waiting, 0, None)))
    floor_abs = th.abs_floor_us * 1000.0

    def thresholds_for(sig: float) -> tuple[np.ndarray, np.ndarray]:
        floor = max(th.k_sigma * sig, floor_abs)
        floor_p = max(min(th.k_sigma * sig, th.persistent_noise_cap * clean_ref), floor_abs)
        return factor * max(floor_p, th.rel_step * clean_ref), factor * max(floor, th.rel_step_intermittent * clean_ref)

    sigma = noise_sigma(inst)
    cand = factor * max(0.5 * th.k_sigma * sigma, floor_abs, th.rel_step_intermittent * clean_ref)
    ev_steps = set(np.flatnonzero((r0.step_imposed >= cand[:, None]).any(axis=1)).tolist())
    if 1 <= len(ev_steps) <= len(steps) / 2:
        sigma2 = noise_sigma(inst.filter(pl.col("step").is_in([s for k, s in enumerate(steps) if k not in ev_steps])))
        if 0 < sigma2 < sigma:
            sigma = sigma2
    thr_p, thr_i = thresholds_for(sigma)
    return sigma, thr_p, thr_i


def _name_ranks(
    mx: _Matrix, r0: _Round, th: StragglerThresholds, total_T: float, thr_p: np.ndarray, thr_i: np.ndarray, sigma: float
) -> list[_Named]:
    """Greedy what-if over sets: name ranks round by round (module docstring); when no single
    rank passes, a pair of ranks that are each last far more often than chance and together
    save enough is named (two stragglers that alternate as the last one each impose little
    alone)."""
    named: list[_Named] = []
    fixed: set[int] = set()
    rnd = r0
    floor = max(th.abs_floor_us * 1000.0, sigma, 0.01 * (total_T / max(len(mx.steps), 1)))
    quiet = np.ones(len(mx.steps), dtype=bool)
    # every rank may be named: with the others fixed the last free rank can only be named by
    # magnitude (it is last whenever it is not early, chance ~ its own rate), e.g. a 2-rank
    # job whose two ranks each stall once
    while len(named) < min(th.max_named, len(mx.ranks)):
        picks = (_single(mx, rnd, fixed, th, total_T, thr_p, thr_i, floor, quiet)
                 or _pair(mx, rnd, fixed, th, total_T, floor, quiet))
        if not picks:
            break
        named += picks
        fixed |= {nm.rank for nm in picks}
        for nm in picks:  # a stall perturbs everybody's arrivals: no frequency evidence from its steps
            if not nm.freq:
                quiet &= ~nm.late
        rnd = _round(mx, fixed, th.tie_us * 1000.0)
    return named


def _frequency(rnd: _Round, j: int, qi: np.ndarray) -> tuple[int, float]:
    """Rank ``j``'s last count and binomial p-value over the instances ``qi`` (quiet steps)."""
    n = int(qi.sum())
    k = int(rnd.last[qi, j].sum())
    size = rnd.last[qi].sum(axis=1)
    p0 = float(size.mean()) / rnd.free if n and size.any() else 1.0 / rnd.free
    return k, binom_sf(k, n, min(p0, 1.0))


def _late_alone(mx: _Matrix, named: list[_Named], thr_p: np.ndarray, th: StragglerThresholds) -> None:
    """Set each arrival-named rank's steps late beyond the persistent threshold once the other
    named ranks are fixed (a pair: its partner is not fixed, and each member gets the pair's
    joint late steps). Two stragglers with the same delay alternate as the last one: in the
    round that names the first, it imposes only in the steps where it beat the other, so its
    own late steps undercount it; with the other fixed it is late in every step it delays."""
    arrival = [nm for nm in named if not nm.by_link]
    if len(arrival) < 2:
        return
    for nm in arrival:
        keep = {nm.rank, nm.partner}
        rnd = _round(mx, {x.rank for x in arrival if x.rank not in keep}, th.tie_us * 1000.0)
        worst = rnd.step_imposed.max(axis=1)
        js = [mx.ranks.index(r) for r in keep if r is not None]
        imp = rnd.step_imposed[:, js]
        nm.alone_late = ((imp >= thr_p[:, None]) & (imp >= th.rel_to_worst * worst[:, None])).any(axis=1)
        nm.alone_imposed = imp.sum(axis=1)  # a pair: the two alternate, their waits add up per step
    for nm in arrival:  # a pair is judged jointly: either member late
        if nm.partner is not None and nm.alone_late is not None:
            mate = next((x for x in arrival if x.rank == nm.partner), None)
            if mate is not None:
                nm.alone_late = nm.alone_late | mate.late | nm.late


def _is_persistent(nm: _Named, mx: _Matrix, th: StragglerThresholds, by_steps: bool) -> bool:
    """Late in at least ``persistent_share`` of the units (steps; instances for short traces)
    and in far more of them than chance (binomial against 1/N per step, the round's ``p0`` per
    instance): with two ranks, 6 late steps of 10 are what chance gives one of them."""
    if nm.link is not None and nm.by_link:
        # named for its late ends: persistent when they recur (in most steps; short traces: min_events)
        if by_steps:
            return bool(nm.late.mean() >= th.persistent_share)
        return nm.link.late >= th.min_events
    size = 1 if nm.partner is None else 2  # a pair is judged jointly: either of the two last
    if by_steps:
        late = nm.late if nm.alone_late is None else nm.late | nm.alone_late
        k, n, p0 = int(late.sum()), len(late), size / nm.rnd.free
    else:
        js = [mx.ranks.index(r) for r in (nm.rank, nm.partner) if r is not None]
        k, n, p0 = int(nm.rnd.last[:, js].any(axis=1).sum()), nm.rnd.last.shape[0], size * nm.rnd.p0
    if n == 0 or k / n < th.persistent_share or binom_sf(k, n, p0) >= th.alpha:
        return False
    return nm.freq or nm.big_steps >= th.persistent_share * len(mx.steps)


def _single(
    mx: _Matrix, rnd: _Round, fixed: set[int], th: StragglerThresholds, total_T: float,
    thr_p: np.ndarray, thr_i: np.ndarray, floor: float, quiet: np.ndarray,
) -> list[_Named]:
    """The rank imposing the most wait that passes the frequency or the magnitude route. The
    frequency route reads only the quiet steps (no stall of a rank named by magnitude)."""
    tot = rnd.imposed.sum(axis=0)
    worst = rnd.step_imposed.max(axis=1)
    for j in np.argsort(-tot, kind="stable"):
        r = mx.ranks[int(j)]
        if r in fixed or tot[j] <= 0:
            continue
        top = rnd.step_imposed[:, j] >= th.rel_to_worst * worst
        events = (rnd.step_imposed[:, j] >= thr_i) & top
        # frequency evidence from steps without a stall, its own or a named rank's
        # (with fewer than min_steps_confident steps the instances are the units: a one-step
        # trace's only step is not left out for holding the rank's own lateness)
        own_quiet = quiet & ~events if len(mx.steps) >= th.min_steps_confident else quiet
        qi = own_quiet[mx.step_idx]
        _, p_q = _frequency(rnd, int(j), qi)
        freq = (
            p_q < th.alpha
            and _steady_effect(rnd, int(j), own_quiet) >= th.min_rank_effect * total_T
            and float(rnd.imposed[qi, j].sum()) >= th.min_share * float(rnd.imposed[qi].sum())
        )
        ev = int(events.sum())
        big = int(((rnd.step_imposed[:, j] >= thr_p) & top).sum())
        if freq or ev >= 1:
            steady_big = big >= th.persistent_share * len(mx.steps) and len(mx.steps) >= 2
            if freq:
                late = events | (top & (rnd.step_imposed[:, j] >= floor) & own_quiet)
            else:  # by magnitude: late beyond the persistent threshold when that is its pattern
                late = top & (rnd.step_imposed[:, j] >= thr_p) if steady_big else events
            k, p = _frequency(rnd, int(j), np.ones(len(mx.step_idx), dtype=bool))
            return [_Named(r, freq, ev, big, late, rnd, p, k)]
    return []


def _pair(
    mx: _Matrix, rnd: _Round, fixed: set[int], th: StragglerThresholds, total_T: float, floor: float,
    quiet: np.ndarray, top_k: int = 6,
) -> list[_Named]:
    """Two ranks that are the two latest arrivals far more often than chance (binomial against
    ``1 / C(N', 2)``, Bonferroni-corrected over the pairs tried, among the ``top_k`` ranks most
    often last) and whose joint what-if saves at least twice ``min_rank_effect`` of the step
    time. Two stragglers with the same delay alternate as the last one: each alone is last only
    half the time and imposes only the jitter between them, but together they are the two
    latest almost every time, which noise seldom makes two given ranks."""
    qi = quiet[mx.step_idx]
    n = int(qi.sum())
    if n == 0 or rnd.free < 3:
        return []
    A = _fixed_arrivals(mx, fixed)
    top2 = np.sort(np.argsort(-A, axis=1, kind="stable")[:, :2], axis=1)[qi]
    counts = [(int(rnd.last[qi, j].sum()), j) for j, r in enumerate(mx.ranks) if r not in fixed]
    cands = [c for c in sorted(counts, reverse=True)[:top_k] if c[0] > 0]
    tries = max(len(cands) * (len(cands) - 1) // 2, 1)
    p0 = 2.0 / (rnd.free * (rnd.free - 1))
    base = _waiting_fixed(mx, fixed)
    best: tuple[float, int, int, np.ndarray] | None = None
    for x in range(len(cands)):
        for y in range(x + 1, len(cands)):
            ja, jb = sorted((cands[x][1], cands[y][1]))
            k = int(((top2[:, 0] == ja) & (top2[:, 1] == jb)).sum())
            if binom_sf(k, n, p0) >= th.alpha / tries:
                continue
            saved = np.where(quiet, np.clip(base - _waiting_fixed(mx, fixed | {mx.ranks[ja], mx.ranks[jb]}), 0, None), 0.0)
            if best is None or saved.sum() > best[0]:
                best = (float(saved.sum()), ja, jb, saved)
    if best is None or best[0] < 2 * th.min_rank_effect * total_T:
        return []
    out = []
    for j, other in ((best[1], best[2]), (best[2], best[1])):
        k, p = _frequency(rnd, j, np.ones(len(mx.step_idx), dtype=bool))
        in_step = np.bincount(mx.step_idx[rnd.last[:, j]], minlength=len(mx.steps)) > 0
        out.append(_Named(mx.ranks[j], True, 0, 0, (best[3] >= floor) & in_step, rnd, p, k, partner=mx.ranks[other]))
    return out


def _steady_effect(rnd: _Round, j: int, quiet: np.ndarray) -> float:
    """Rank ``j``'s imposed wait in the quiet steps without its single largest step (one step:
    without its largest instance): the frequency route must not borrow its effect size from
    one stall."""
    per_step = rnd.step_imposed[quiet, j]
    if per_step.size >= 2:
        return float(per_step.sum() - per_step.max())
    if per_step.size == 0:
        return 0.0
    per_inst = rnd.imposed[:, j]
    return float(per_step.sum()) * (float(per_inst.sum() - per_inst.max()) / float(per_inst.sum())) if per_inst.sum() > 0 else 0.0


def _per_step(
    mx: _Matrix,
    r0: _Round,
    T_ns: np.ndarray,
    excess: np.ndarray,
    thr_i: np.ndarray,
    thr_p: np.ndarray,
    bd: pl.DataFrame,
    late: dict[int, np.ndarray],
) -> pl.DataFrame:
    counts = np.bincount(mx.step_idx, minlength=len(mx.steps))
    lat = bd.group_by("step").agg(pl.col("lateness(us)").max().alias("_ml"))
    maxlat = {s: v for s, v in lat.iter_rows()}
    rows = []
    for k, s in enumerate(mx.steps):
        top = int(np.argmax(r0.step_imposed[k])) if counts[k] else None
        rows.append({
            "step": s,
            "step_time(us)": T_ns[k] / 1000.0,
            "lost(us)": r0.waiting[k] / 1000.0,
            "excess(us)": excess[k] / 1000.0,
            "est_step_time(us)": (T_ns[k] - excess[k]) / 1000.0,
            "threshold(us)": thr_i[k] / 1000.0,
            "persistent_threshold(us)": thr_p[k] / 1000.0,
            "last_rank": mx.ranks[top] if top is not None and r0.step_imposed[k, top] > 0 else None,
            "max_lateness(us)": maxlat.get(s),
            "late_ranks": sorted(r for r, v in late.items() if v[k]),
            "n_instances": int(counts[k]),
            "max_imposed(us)": float(r0.step_imposed[k].max()) / 1000.0 if mx.ranks else 0.0,
        })
    return pl.DataFrame(rows, schema=PER_STEP_SCHEMA, orient="row")


def _lost_shares(mx: _Matrix, order: list[int], waiting: np.ndarray) -> dict[int, float]:
    """Each named rank's share of the time the named ranks cost: its marginal what-if saving
    in naming order (fixing it after the ranks named before it) over the saving of all."""
    out: dict[int, float] = {}
    prev, fixed = float(waiting.sum()), set()
    total = prev - float(_waiting_fixed(mx, set(order)).sum())
    for r in order:
        fixed.add(r)
        now = float(_waiting_fixed(mx, fixed).sum())
        out[r] = (prev - now) / total if total > 0 else 0.0
        prev = now
    return out


def _confidence(rep: StragglerReport, th: StragglerThresholds) -> str:
    """``high``: at least ``min_steps_confident`` steps or 32 instances; ``medium``: at least 8
    instances (one step of a large model); else ``low``."""
    if rep.steps_analysed >= th.min_steps_confident or rep.instances >= 32:
        return "high"
    return "medium" if rep.instances >= 8 else "low"


def _spike_share(nm: _Named, mx: _Matrix, th: StragglerThresholds) -> float:
    """Share of a rank's imposed wait that falls in its spike steps (steps imposing more than
    ``spike_factor`` times its median step); 0 with fewer than ``min_steps_confident`` steps."""
    # with the other named ranks fixed: in its own naming round a straggler that alternates
    # with another as the last one imposes only where it beat it, which reads as spikes
    per_step = nm.rnd.step_imposed[:, mx.ranks.index(nm.rank)] if nm.alone_imposed is None else nm.alone_imposed
    med = float(np.median(per_step))
    if len(per_step) < th.min_steps_confident or med <= 0 or per_step.sum() <= 0:
        return 0.0
    return float(per_step[per_step > th.spike_factor * med].sum() / per_step.sum())


def _pattern(persistent: list[_Named], skew_spikes: list[_Named], mx: _Matrix, th: StragglerThresholds) -> str:
    if skew_spikes:
        return "steady skew with spikes"
    if not persistent:
        return "bursts"
    if any(_spike_share(nm, mx, th) > 0 for nm in persistent):
        return "steady with spikes"
    return "steady"


def _reason(rep: StragglerReport, named: list[_Named]) -> str:
    parts = []
    for nm in named:
        if nm.rank not in rep.ranks and nm.rank not in rep.intermittent_ranks:
            continue
        if nm.link is not None and nm.by_link:
            parts.append(f"rank {nm.rank}'s collectives end late after its peers' at {nm.link.late}/{nm.link.instances} "
                         f"collectives ({nm.link.late} of the {nm.link.events} late ends, chance 1/{nm.link.world}, "
                         f"p={nm.p:.2g}), late in {int(nm.late.sum())}/{rep.steps_analysed} steps")
            continue
        parts.append(
            f"rank {nm.rank} last at {nm.k}/{rep.instances} collectives (chance {100 * nm.rnd.p0:.0f}%, "
            f"p={nm.p:.2g}), late in {int(nm.late.sum())}/{rep.steps_analysed} steps"
        )
    return "; ".join(parts)


def _next_ranks(mx: _Matrix, final: _Round, fixed: set[int], T_ns: np.ndarray) -> list[dict[str, Any]]:
    """Once the named ranks are fixed, who would hold the job back next (top two, with the wait
    they would impose per step)."""
    tot = final.step_imposed.sum(axis=0)
    out = []
    for j in np.argsort(-tot, kind="stable"):
        r = mx.ranks[int(j)]
        if r in fixed or tot[j] <= 0:
            continue
        out.append({
            "rank": r,
            "imposed_per_step_us": float(tot[j]) / len(mx.steps) / 1000.0,
            "share_of_step": float(tot[j]) / float(T_ns.sum()) if T_ns.sum() > 0 else None,
            "last_count": int(final.last[:, j].sum()),
        })
        if len(out) == 2:
            break
    return out


# ---- causes compared with peers --------------------------------------------------------------------------

_CAUSE_COLUMNS = {
    "compute": ("compute(us)", "its compute"),
    "dataloader": ("dataloader(us)", "its data loading"),
    "host_gap": ("idle(us)", "host gaps (idle, no profiled op running)"),
    "transfer": ("transfer(us)", "its collectives' own transfer time"),
}


def rank_cause(bd: pl.DataFrame, r: int, steps: list[int] | None = None) -> dict[str, Any]:
    """Why rank ``r`` is late, compared with its peers: per-step means of compute, data loading,
    host gaps (CPU: idle host time; GPU: launch gaps) and own transfer time, each against the
    median of the other ranks, over ``steps`` (the steps it was late in; all when empty); the
    component whose excess explains at least half of the rank's mean lateness there is the
    cause (else: outside profiled work)."""
    gpu = bd["launch_gap(us)"].null_count() < bd.height
    if steps:
        bd = bd.filter(pl.col("step").is_in(steps))
    cols = dict(_CAUSE_COLUMNS)
    if gpu:
        cols["host_gap"] = ("launch_gap(us)", "GPU idle waiting for the host to launch work")
    means = bd.group_by("rank").agg([pl.col(c).fill_null(0).mean().alias(k) for k, (c, _) in cols.items()]
                                    + [pl.col("lateness(us)").mean().alias("_late")])
    mine = means.filter(pl.col("rank") == r)
    peers = means.filter(pl.col("rank") != r)
    out: dict[str, Any] = {"lateness_ms_per_step": None, "components": {}, "explained_by": None, "text": ""}
    if mine.is_empty() or peers.is_empty():
        out["text"] = "no peers to compare with"
        return out
    late = float(mine["_late"][0] or 0.0)
    out["lateness_ms_per_step"] = round(late / 1000.0, 3)
    best, best_x = None, 0.0
    for k in cols:
        own, med = float(mine[k][0] or 0.0), float(peers[k].median() or 0.0)  # type: ignore[arg-type]
        out["components"][k] = {"rank_ms": round(own / 1000.0, 3), "peers_median_ms": round(med / 1000.0, 3),
                                "excess_ms": round((own - med) / 1000.0, 3),
                                "ratio": round(own / med, 3) if med > 0 else None}
        if own - med > best_x:
            best, best_x = k, own - med
    comp = out["components"]["compute"]
    if best is not None and late > 0 and best_x >= 0.5 * late:
        out["explained_by"] = best
        c = out["components"][best]
        ratio = f" ({c['ratio']:.2f}x)" if c["ratio"] else ""
        out["text"] = (f"{cols[best][1]}: {c['rank_ms']:.1f} ms per step vs peers' median {c['peers_median_ms']:.1f} ms"
                       f"{ratio}, +{c['excess_ms']:.1f} ms of its {late / 1000:.1f} ms lateness")
    else:
        ratio = f"{comp['ratio']:.2f}x" if comp["ratio"] else "n/a"
        out["text"] = (f"not explained by profiled work (compute {ratio} the peers' median, data loading "
                       f"{out['components']['dataloader']['excess_ms']:+.1f} ms vs peers): suspect its host "
                       "(CPU contention, I/O, GC) or its link")
    return out


def _per_rank(
    bd: pl.DataFrame,
    hosts: dict[int, str | None],
    mx: _Matrix | None,
    named: dict[int, _Named] | None,
    roles: dict[int, str],
    final: _Round | None = None,
    T_ns: np.ndarray | None = None,
    lost_share: dict[int, float] | None = None,
) -> pl.DataFrame:
    if bd.is_empty():
        return pl.DataFrame(schema=PER_RANK_SCHEMA)
    Tdf = bd.group_by("step").agg(pl.col("step_time(us)").median().alias("_T"))
    total_T = float(Tdf["_T"].sum()) or 1.0
    x = bd.join(Tdf, on="step", how="left")
    agg = x.group_by("rank").agg(
        pl.len().cast(pl.Int64).alias("steps"),
        pl.col("lateness(us)").mean().alias("mean_lateness(us)"),
        (pl.col("lateness(us)") / pl.col("_T")).mean().alias("mean_lateness_frac"),
        (pl.col("lateness(us)").sum() / total_T).alias("score"),
        pl.col("self_time(us)").mean().alias("mean_self_time(us)"),
        pl.col("compute(us)").mean().alias("mean_compute(us)"),
        pl.col("sync_wait(us)").mean().alias("mean_sync_wait(us)"),
        pl.col("dataloader(us)").mean().alias("mean_dataloader(us)"),
    )
    med = agg["mean_compute(us)"].median()
    extra: dict[str, list[Any]] = {k: [] for k in ("rank", "instances", "last_count", "p_value", "imposed_wait(us)",
                                                   "imposed_share", "whatif_saving(us)", "role", "late_steps")}
    if mx is not None and final is not None and T_ns is not None:
        named = named or {}
        n_inst = mx.A.shape[0]
        base = _waiting_fixed(mx, set()).sum()
        for j, r in enumerate(mx.ranks):
            rnd = named[r].rnd if r in named else final
            late = named[r].late if r in named else np.zeros(len(mx.steps), bool)
            k = int(rnd.last[:, j].sum())
            tot = float(rnd.imposed.sum())
            extra["rank"].append(r)
            extra["instances"].append(n_inst)
            extra["last_count"].append(k)
            extra["p_value"].append(binom_sf(k, n_inst, rnd.p0))
            extra["imposed_wait(us)"].append(float(rnd.step_imposed[:, j].sum()) / 1000.0)
            extra["imposed_share"].append(float(rnd.imposed[:, j].sum()) / tot if tot > 0 else 0.0)
            extra["whatif_saving(us)"].append(float(base - _waiting_fixed(mx, {r}).sum()) / len(mx.steps) / 1000.0)
            extra["role"].append(roles.get(r))
            extra["late_steps"].append(int(late.sum()))
    ex = pl.DataFrame(extra, schema={"rank": pl.Int64, "instances": pl.Int64, "last_count": pl.Int64,
                                     "p_value": pl.Float64, "imposed_wait(us)": pl.Float64, "imposed_share": pl.Float64,
                                     "whatif_saving(us)": pl.Float64, "role": pl.String, "late_steps": pl.Int64})
    agg = (
        agg.join(ex, on="rank", how="left")
        .with_columns(
            pl.col("late_steps").fill_null(0),
            (pl.col("mean_compute(us)") / med).alias("compute_vs_median") if med else pl.lit(None, dtype=pl.Float64).alias("compute_vs_median"),
            pl.col("rank").map_elements(lambda r: hosts.get(r), return_dtype=pl.String).alias("host"),
            pl.col("rank").replace_strict(lost_share or {}, default=None, return_dtype=pl.Float64).alias("lost_share"),
        )
        .with_columns((pl.col("late_steps") / pl.col("steps")).alias("late_share"))
    )
    return agg.select(list(PER_RANK_SCHEMA)).cast(PER_RANK_SCHEMA).sort("rank")  # type: ignore[arg-type]
