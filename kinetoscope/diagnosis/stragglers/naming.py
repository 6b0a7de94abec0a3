"""Which ranks to name, and whether each is persistent: the noise thresholds, the greedy what-if
over sets of ranks (frequency, magnitude and pair routes) and the persistence tests
(``docs/diagnosis.md`` §5)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import comb
from typing import Any

import numpy as np
import polars as pl

from kinetoscope.diagnosis.attribution import (
    Matrix,
    Round,
    attribution_round,
    binom_sf,
    fixed_arrivals,
    noise_sigma,
    saving_fixed,
)
from kinetoscope.diagnosis.stragglers.model import StragglerThresholds
from kinetoscope.diagnosis.stragglers.slow_link import SlowLink
from kinetoscope.diagnosis.stragglers.steady import SteadySkew, steady_skew


@dataclass(frozen=True)
class GroupEvidence:
    """Ranks named together by ``_group``: they were the ``len(members)`` latest arrivals, as a
    set, at ``k`` of ``n`` collectives, where chance makes a given set so with ``p0``
    (``1 / C(free ranks, size)``); ``p`` is the binomial tail of that."""

    members: tuple[int, ...]
    k: int
    n: int
    p0: float
    p: float

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``stragglers.groups``, docs/diagnosis.md §8)."""
        return {
            "ranks": list(self.members),
            "latest_together": self.k,
            "instances": self.n,
            "chance": self.p0,
            "p_value": self.p,
        }


@dataclass
class Named:
    rank: int
    freq: bool
    events: int
    big_steps: int
    late: np.ndarray  # bool [step]
    rnd: Round
    p: float
    k: int
    partner: int | None = None  # named as a pair with this rank (judged jointly)
    link: SlowLink | None = None  # its late collective ends (slow link evidence)
    by_link: bool = False  # named for its late ends alone (not for its arrivals)
    alone_late: np.ndarray | None = None  # bool [step]: late with the other named ranks fixed
    alone_imposed: np.ndarray | None = None  # float [step] (ns): its cost per step with them fixed
    alone_last: np.ndarray | None = None  # bool [inst]: with them fixed, last by the late floor
    alone_p0: float = 0.0  # the chance of being last at an instance in that round
    group: GroupEvidence | None = None  # named with other ranks that arrive late together
    fixed_at: frozenset[int] = frozenset()  # the ranks already named (fixed) when it was named
    free: int = 0  # ranks that could be late in its place, once the verdict's ranks are final
    steady: SteadySkew | None = None  # a rank named for how often it is last: its steady lateness
    every_step: bool = False  # late beyond the persistent threshold in every step (>= 2 steps)
    pair: GroupEvidence | None = None  # named by ``_pair``: how often the two were the two latest

    @property
    def free_ranks(self) -> int:
        """``free`` when set (``recount_free``), else its naming round's."""
        return self.free or self.rnd.free

    @property
    def together(self) -> GroupEvidence | None:
        """The evidence of the ranks it was named with, as a group or a pair (else None)."""
        return self.group if self.group is not None else self.pair

    @property
    def late_steps(self) -> np.ndarray:
        """Bool [step]: late in its naming round or with the other named ranks fixed; the
        steps its persistence is judged on, shown in its reason and counted in ``per_rank``."""
        return self.late if self.alone_late is None else self.late | self.alone_late


def noise_thresholds(
    inst: pl.DataFrame,
    steps: list[int],
    r0: Round,
    T_ns: np.ndarray,
    th: StragglerThresholds,
) -> tuple[float, np.ndarray, np.ndarray]:
    """Arrival noise sigma (ns) and, per step, the persistent and event thresholds (ns); every
    step has the same ones, the first traced step too (a start-up burst there alone is one
    stall, which names no rank: ``min_events``).

    Frequent stalls inflate sigma (with two ranks every stall moves both skews): the steps with
    a candidate event (half the event threshold's noise term) are left out and sigma measured
    again, once, when they are at most half of the steps. The MAD barely moves when a few steps
    of a clean job are left out; it drops when stalls hit a third of the steps. A candidate's
    step floor (``rel_step_candidate``) is above the event threshold's: a step is left out of
    the noise only for a clear stall, else noise steps leave, sigma shrinks, and the noise they
    held passes the lowered threshold (a clean 2-rank job of 30 ms steps: sigma 1.0 -> 0.55 ms)."""
    clean_ref = float(np.median(np.clip(T_ns - r0.waiting, 0, None)))
    floor_abs = th.abs_floor_us * 1000.0
    n = len(steps)

    def thresholds_for(sig: float) -> tuple[np.ndarray, np.ndarray]:
        floor = max(th.k_sigma * sig, floor_abs)
        floor_p = max(min(th.k_sigma * sig, th.persistent_noise_cap * clean_ref), floor_abs)
        return np.full(n, max(floor_p, th.rel_step * clean_ref)), np.full(
            n, max(floor, th.rel_step_intermittent * clean_ref)
        )

    sigma = noise_sigma(inst)
    cand = max(0.5 * th.k_sigma * sigma, floor_abs, th.rel_step_candidate * clean_ref)
    ev_steps = set(np.flatnonzero((r0.step_imposed >= cand).any(axis=1)).tolist())
    if 1 <= len(ev_steps) <= len(steps) / 2:
        sigma2 = noise_sigma(
            inst.filter(pl.col("step").is_in([s for k, s in enumerate(steps) if k not in ev_steps]))
        )
        if 0 < sigma2 < sigma:
            sigma = sigma2
    thr_p, thr_i = thresholds_for(sigma)
    return sigma, thr_p, thr_i


def name_ranks(
    mx: Matrix,
    r0: Round,
    th: StragglerThresholds,
    total_T: float,
    thr_p: np.ndarray,
    thr_i: np.ndarray,
    sigma: float,
) -> list[Named]:
    """Greedy what-if over sets: name ranks round by round (module docstring); when no single
    rank passes, a pair of ranks that are each last far more often than chance and together
    save enough is named (two stragglers that alternate as the last one each impose little
    alone)."""
    named: list[Named] = []
    fixed: set[int] = set()
    rnd = r0
    floor = late_floor(mx, th, total_T, sigma)
    quiet = np.ones(len(mx.steps), dtype=bool)
    # every rank may be named: with the others fixed the last free rank can only be named by
    # magnitude (it is last whenever it is not early, chance ~ its own rate), e.g. a 2-rank
    # job whose two ranks each stall once
    while len(named) < min(th.max_named, len(mx.ranks)):
        stalled = frozenset(nm.rank for nm in named if _stalls_only(nm, th))
        in_quiet = attribution_round(mx, fixed - stalled, th.tie_us * 1000.0, stalled) if stalled else rnd
        picks = (
            _single(mx, rnd, in_quiet, fixed, th, total_T, thr_p, thr_i, floor, quiet)
            or _pair(mx, rnd, fixed, th, total_T, floor, quiet)
            or _group(mx, rnd, fixed, th, thr_p, floor, quiet)
        )
        if not picks:
            break
        for nm in picks:
            nm.fixed_at = frozenset(fixed)
        named += picks
        fixed |= {nm.rank for nm in picks}
        for nm in picks:  # a stall perturbs everybody's arrivals: no frequency evidence from its steps
            if not nm.freq:
                quiet &= ~nm.late
        rnd = attribution_round(mx, fixed, th.tie_us * 1000.0)
    return named


def _stalls_only(nm: Named, th: StragglerThresholds) -> bool:
    """Named for stalls in a minority of the steps (magnitude, not every step): outside them it
    arrives like any rank, so the frequency route reads it there with its own arrivals
    (``attribution_round``'s ``keep``)."""
    return not nm.freq and not nm.every_step and float(nm.late.mean()) < th.persistent_share


def late_floor(mx: Matrix, th: StragglerThresholds, total_T: float, sigma: float) -> float:
    """The least imposed wait (ns) that makes a rank named for how often it is last *late in a
    step*: the noise (sigma), 1 % of a mean step, and ``abs_floor_us``."""
    return max(th.abs_floor_us * 1000.0, sigma, 0.01 * (total_T / max(len(mx.steps), 1)))


def frequency(rnd: Round, j: int, qi: np.ndarray) -> tuple[int, float]:
    """Rank ``j``'s last count and binomial p-value over the instances ``qi`` (quiet steps)."""
    n = int(qi.sum())
    k = int(rnd.last[qi, j].sum())
    size = rnd.last[qi].sum(axis=1)
    p0 = float(size.mean()) / rnd.free if n and size.any() else 1.0 / rnd.free
    if rnd.chance is not None and n:  # process groups: a member's chance is its group's
        p0 = float(rnd.chance[qi].mean()) if size.any() else p0
    return k, binom_sf(k, n, min(p0, 1.0))


def late_alone(
    mx: Matrix, named: list[Named], thr_p: np.ndarray, th: StragglerThresholds, floor: float
) -> None:
    """Set each arrival-named rank's late steps once the other named ranks are fixed (a pair:
    its partner is not fixed, and each member gets the pair's joint late steps), by the bar it
    was named with: ``floor`` (``late_floor``) for a rank named for how often it is last, the
    persistent threshold for one named for its stalls. Two stragglers with the same delay
    alternate as the last one: in the round that names the first, it imposes only in the steps
    where it beat the other, so its own late steps undercount it; with the other fixed it is
    late in every step it delays (a real 6-rank job: the second of two 30 ms sleepers imposed
    ~30 ms per step with the first fixed, under a persistent threshold of 8 sigma = 35 ms)."""
    arrival = [nm for nm in named if not nm.by_link]
    if len(arrival) < 2:
        return
    for nm in arrival:
        if nm.group is not None:
            _group_alone(mx, nm, {x.rank for x in arrival if x.rank not in nm.group.members}, floor)
            continue
        keep = {nm.rank, nm.partner}
        others = {x.rank for x in arrival if x.rank not in keep}
        rnd = attribution_round(mx, others, th.tie_us * 1000.0)
        worst = rnd.step_imposed.max(axis=1)
        js = [mx.ranks.index(r) for r in keep if r is not None]
        # per instance (short traces): the last one by at least the late floor, not by chance
        nm.alone_last = np.asarray((rnd.last[:, js] & (rnd.imposed[:, js] >= floor)).any(axis=1))
        nm.alone_p0 = rnd.p0
        imp = rnd.step_imposed[:, js]
        bar = np.full(len(mx.steps), floor) if nm.freq else thr_p
        nm.alone_late = ((imp >= bar[:, None]) & (imp >= th.rel_to_worst * worst[:, None])).any(axis=1)
        # a pair's cost per step is what fixing both saves: when they take turns being last their
        # waits add up, when they are late together each imposes only its margin over the other
        nm.alone_imposed = (
            imp.sum(axis=1)
            if nm.partner is None
            else saving_fixed(mx, others, others | {nm.rank, nm.partner})
        )
    for nm in arrival:  # a pair is judged jointly: either member late
        if nm.partner is not None and nm.alone_late is not None:
            mate = next((x for x in arrival if x.rank == nm.partner), None)
            if mate is not None:
                nm.alone_late = nm.alone_late | mate.late | nm.late


def _group_alone(mx: Matrix, nm: Named, others: set[int], floor: float) -> None:
    """A group member's late steps and per-step cost with the other named ranks fixed: what the
    group saves together (each member alone imposes only its margin over the next member)."""
    assert nm.group is not None
    joint = saving_fixed(mx, others, others | set(nm.group.members))
    nm.alone_imposed = joint
    nm.alone_late = joint >= floor


def recount_free(mx: Matrix, named: list[Named]) -> None:
    """Each named rank's ``free``: the ranks not fixed when it was named, counting as fixed only
    those still named. A rank fixed in its round and dropped afterwards (one stall too small to
    keep) was free after all: left counted, it raised a pair's chance of being late in a step
    from 2/4 to 2/3, and 13 late steps of 16 (a real 5-rank job) read as chance."""
    final = {nm.rank for nm in named}
    for nm in named:
        nm.free = max(len(mx.ranks) - len(nm.fixed_at & final), 1)


def attach_steady(mx: Matrix, named: list[Named], mean_step_ns: float, th: StragglerThresholds) -> None:
    """Set the steady-lateness evidence (``steady.py``) of each rank named alone for how often
    it is last, measured against the ranks not named."""
    ranks = {nm.rank for nm in named}
    for nm in named:
        if named_alone_by_frequency(nm):
            ev = steady_skew(mx, nm.rank, ranks - {nm.rank}, mean_step_ns)
            nm.steady = replace(ev, late=steadily_late(ev, nm.free_ranks, th))


def named_alone_by_frequency(nm: Named) -> bool:
    """Named on its own (not in a pair or group, not for late ends) for how often it is last:
    the ranks the steady-lateness test applies to."""
    return nm.freq and nm.partner is None and nm.group is None and not nm.by_link


def steadily_late(s: SteadySkew, free: int, th: StragglerThresholds) -> bool:
    """Behind the others' mean arrival (``steady.step_skews``) by at least ``min_rank_effect``
    of a step at the median step, and in far more steps than chance: either so many that the
    sign test (binomial against 1/2) alone passes ``steady_alpha`` (15 of 16 steps), or both
    the sign test and the t-test of a consistent margin pass ``alpha``; each over the ranks
    that could have been late in its place (Bonferroni). Needing both tests at ``alpha`` is a
    false alarm no more often than either alone. A rank delayed a lot in most steps but not
    all (2 ranks, 8 of 12 steps) has a mean skew far above zero yet is behind in no more steps
    than chance gives; one the host delays now and then is behind in many steps by a little
    and in a few by a lot, which the t-test's spread tells. A rank behind in all or all but one
    of 16 steps is steady whatever its spikes add to the spread: bursts do not make a rank late
    in nearly every step. One test alone needs the stricter ``steady_alpha``: the rank tested
    was picked for being last often, which on a noisy host goes with a positive mean skew.
    ``free``: the named rank's ``free_ranks`` (docs/diagnosis-stragglers.md, "Steady lateness")."""
    sign_p = binom_sf(s.behind, s.steps, 0.5)
    return (
        s.steps >= th.min_steps_confident
        and s.median_share >= th.min_rank_effect
        and (sign_p < th.steady_alpha / free or (sign_p < th.alpha / free and s.p < th.alpha / free))
    )


def is_persistent(nm: Named, mx: Matrix, th: StragglerThresholds, by_steps: bool) -> bool:
    """Late in at least ``persistent_share`` of the units (steps; instances for short traces)
    and in far more of them than chance (binomial against 1/N per step, the round's ``p0`` per
    instance; with two ranks, 6 late steps of 10 are what chance gives one of them), or late
    beyond the persistent threshold in every step (``every_step``: its size rules chance out). Or, for a
    rank named for how often it is last, steadily late (``steadily_late``): a small steady delay
    on a noisy host is last in only some steps, yet behind its peers in nearly all."""
    if nm.link is not None and nm.by_link:
        # named for its late ends: persistent when they recur (in most steps; short traces: min_events)
        if by_steps:
            return bool(nm.late.mean() >= th.persistent_share)
        return nm.link.late >= th.min_events
    if by_steps and nm.steady is not None and nm.steady.late:
        return True
    k, n, p = late_units(nm, mx, by_steps)
    if n == 0 or k / n < th.persistent_share or (p >= th.alpha and not nm.every_step):
        return False
    # named for its stalls: beyond the persistent threshold in most steps, in its naming round or
    # with the other named ranks fixed (``late_alone``: by that threshold). Two ranks of three
    # sleeping 24-36 ms each step (a real job): the one named first stalled beyond the other only
    # in 2 steps, and with the other fixed it is 23-37 ms late in every step
    alone = int(nm.alone_late.sum()) if nm.alone_late is not None else 0
    return nm.freq or max(nm.big_steps, alone) >= th.persistent_share * len(mx.steps)


def late_units(nm: Named, mx: Matrix, by_steps: bool) -> tuple[int, int, float]:
    """The units a named rank is late in, of how many, and the chance of that many or more: its
    late steps against 1/N per step (``by_steps``), else the instances where it is in the last
    group (``_late_instances``). A pair is judged jointly: either of the two last; at the
    instances of two or more steps, the two latest together (``Named.pair``), as a group is:
    either of two ranks is last at half the instances by chance with four ranks, so 9 of 10
    (p = 0.03) read as chance for a node's two ranks late together in both steps of a short
    trace. Not in one step: two ranks late together there are one observation, which one burst
    on one node also makes (the real 8-rank DLRM step's two pairs, beside its straggler)."""
    g = nm.group
    if g is None and not by_steps and len(mx.steps) >= 2:
        g = nm.pair
    if g is not None:  # the chance of a given set being the latest ones
        late = nm.late_steps
        k, n = (int(late.sum()), len(late)) if by_steps else (g.k, g.n)
        return k, n, binom_sf(k, n, g.p0) if n else 1.0
    if not by_steps:
        return _late_instances(nm, mx)
    size = 1 if nm.partner is None else 2
    k, n = int(nm.late_steps.sum()), len(nm.late_steps)
    return k, n, binom_sf(k, n, size / nm.free_ranks) if n else 1.0


def _late_instances(nm: Named, mx: Matrix) -> tuple[int, int, float]:
    """``late_units`` per instance (short traces): where the rank (or either of a pair) is in
    the last group of its naming round, against that round's ``p0``; or, when that is stronger
    evidence, also where it is last by the late floor with the other named ranks fixed
    (``Named.alone_last``, as its late steps are), against the larger ``p0`` of the two rounds
    (fixing ranks raises a free rank's chance). Of two ranks late alike that take turns as the
    last one, the first named is last at only half the instances of its round (64 ranks: 4 of
    9) and at nearly all with the other fixed. By the floor: with the others fixed some rank is
    last at every instance, by chance if by a hair."""
    size = 1 if nm.partner is None else 2
    js = [mx.ranks.index(r) for r in (nm.rank, nm.partner) if r is not None]
    last = np.asarray(nm.rnd.last[:, js].any(axis=1))
    k, n = int(last.sum()), int(last.size)
    if n == 0:
        return 0, 0, 1.0
    p = binom_sf(k, n, size * nm.rnd.p0)
    if nm.alone_last is not None:
        k2 = int((last | nm.alone_last).sum())
        p2 = binom_sf(k2, n, size * max(nm.rnd.p0, nm.alone_p0))
        if p2 < p:
            return k2, n, p2
    return k, n, p


def _single(
    mx: Matrix,
    rnd: Round,
    in_quiet: Round,
    fixed: set[int],
    th: StragglerThresholds,
    total_T: float,
    thr_p: np.ndarray,
    thr_i: np.ndarray,
    floor: float,
    quiet: np.ndarray,
) -> list[Named]:
    """The rank imposing the most wait that passes the frequency or the magnitude route. The
    frequency route reads only the quiet steps (no stall of a rank named by magnitude), in
    ``in_quiet``: the round where the ranks named for a few stalls keep their arrivals
    (``_stalls_only``). Moved to the typical arrival of the last two free ranks, the earlier of
    them, they would leave a rank that is merely later than one early peer looking last far
    more often than chance (docs/diagnosis-stragglers.md, the quiet steps)."""
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
        _, p_q = frequency(in_quiet, int(j), qi)
        freq = (
            p_q < th.alpha / in_quiet.free  # Bonferroni: the round may test each of its free ranks
            and _steady_effect(in_quiet, int(j), own_quiet) >= th.min_rank_effect * total_T
            and float(in_quiet.imposed[qi, j].sum()) >= th.min_share * float(in_quiet.imposed[qi].sum())
        )
        ev = int(events.sum())
        big = int(((rnd.step_imposed[:, j] >= thr_p) & top).sum())
        every_step = big == len(mx.steps) >= 2  # a short trace's steady straggler: no stall, few instances
        if freq or ev >= 1 or every_step:
            steady_big = big >= th.persistent_share * len(mx.steps) and len(mx.steps) >= 2
            if freq:
                late = events | (top & (rnd.step_imposed[:, j] >= floor) & own_quiet)
            else:  # by magnitude: late beyond the persistent threshold when that is its pattern
                late = top & (rnd.step_imposed[:, j] >= thr_p) if steady_big else events
            k, p = frequency(rnd, int(j), np.ones(len(mx.step_idx), dtype=bool))
            return [Named(r, freq, ev, big, late, rnd, p, k, every_step=every_step)]
    return []


def _pair(
    mx: Matrix,
    rnd: Round,
    fixed: set[int],
    th: StragglerThresholds,
    total_T: float,
    floor: float,
    quiet: np.ndarray,
    top_k: int = 6,
) -> list[Named]:
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
    A = fixed_arrivals(mx, fixed)
    top2 = np.sort(np.argsort(-A, axis=1, kind="stable")[:, :2], axis=1)[qi]
    counts = [(int(rnd.last[qi, j].sum()), j) for j, r in enumerate(mx.ranks) if r not in fixed]
    cands = [c for c in sorted(counts, reverse=True)[:top_k] if c[0] > 0]
    tries = max(len(cands) * (len(cands) - 1) // 2, 1)
    p0 = 2.0 / (rnd.free * (rnd.free - 1))
    best: tuple[float, int, int, int] | None = None
    for x in range(len(cands)):
        for y in range(x + 1, len(cands)):
            ja, jb = sorted((cands[x][1], cands[y][1]))
            k = int(((top2[:, 0] == ja) & (top2[:, 1] == jb)).sum())
            if binom_sf(k, n, p0) >= th.alpha / tries:
                continue
            pair = fixed | {mx.ranks[ja], mx.ranks[jb]}
            saved = np.where(quiet, saving_fixed(mx, fixed, pair, from_median=True), 0.0)
            if best is None or saved.sum() > best[0]:
                best = (float(saved.sum()), ja, jb, k)
    if best is None or best[0] < 2 * th.min_rank_effect * total_T:
        return []
    members = (mx.ranks[best[1]], mx.ranks[best[2]])
    ev = GroupEvidence(members, best[3], n, p0, binom_sf(best[3], n, p0))
    # late in a step: what the two save together there, from where the instance would then
    # complete (two of three ranks late: the punctual one waits for both; ``saving_fixed``)
    joint = np.where(quiet, saving_fixed(mx, fixed, fixed | set(members)), 0.0)
    out = []
    for j, other in ((best[1], best[2]), (best[2], best[1])):
        k, p = frequency(rnd, j, np.ones(len(mx.step_idx), dtype=bool))
        in_step = np.bincount(mx.step_idx[rnd.last[:, j]], minlength=len(mx.steps)) > 0
        out.append(
            Named(
                mx.ranks[j],
                True,
                0,
                0,
                (joint >= floor) & in_step,
                rnd,
                p,
                k,
                partner=mx.ranks[other],
                pair=ev,
            )
        )
    return out


def _group(
    mx: Matrix,
    rnd: Round,
    fixed: set[int],
    th: StragglerThresholds,
    thr_p: np.ndarray,
    floor: float,
    quiet: np.ndarray,
) -> list[Named]:
    """Ranks late together: the smallest set (2 up to half the free ranks, rounded up, and at
    most ``max_named``) that is the set of the latest arrivals far more often than chance
    (binomial against ``1 / C(free, size)``, Bonferroni over the sizes tried) and whose joint
    what-if saves at least the persistent threshold in ``persistent_share`` of the steps. Half
    the ranks of a two-node job on a slow node arrive late together: no one of them is last more
    often than its peers, and each alone imposes only the jitter between them, so neither the
    single nor the pair route names them (8 ranks, 4 of them 30 ms late in 80 ms steps: `none`).
    The joint saving runs from where the instances would complete (``saving_fixed``): measured
    from the median, a set of half the ranks saves nothing. Larger sets are the few early ranks'
    complement (``_early_few``), not stragglers."""
    free = [j for j, r in enumerate(mx.ranks) if r not in fixed]
    qi = quiet[mx.step_idx]
    n = int(qi.sum())
    sizes = range(2, min((len(free) + 1) // 2, th.max_named - len(fixed)) + 1)
    if n == 0 or len(sizes) == 0:
        return []
    order = np.argsort(-fixed_arrivals(mx, fixed)[:, free][qi], axis=1, kind="stable")
    for size in sizes:
        sets, counts = np.unique(np.sort(order[:, :size], axis=1), axis=0, return_counts=True)
        top = int(np.argmax(counts))
        p0 = 1.0 / comb(len(free), size)
        p = binom_sf(int(counts[top]), n, p0)
        if p >= th.alpha / len(sizes):
            continue
        members = tuple(sorted(mx.ranks[free[int(j)]] for j in sets[top]))
        joint = np.where(quiet, saving_fixed(mx, fixed, fixed | set(members)), 0.0)
        if int((joint >= thr_p).sum()) < th.persistent_share * int(quiet.sum()):
            continue
        ev = GroupEvidence(members, int(counts[top]), n, p0, p)
        out = []
        for r in members:
            k, p_r = frequency(rnd, mx.ranks.index(r), np.ones(len(mx.step_idx), dtype=bool))
            out.append(Named(r, True, 0, 0, joint >= floor, rnd, p_r, k, group=ev))
        return out
    return []


def _steady_effect(rnd: Round, j: int, quiet: np.ndarray) -> float:
    """Rank ``j``'s imposed wait in the quiet steps with its single largest step replaced by the
    mean of its other steps (one step: its largest instance by the mean of its other imposing
    instances): the frequency route must not borrow its effect size from one stall, and must not
    lose a steady rank's effect either (dropping one of two steps halved it)."""
    per_step = rnd.step_imposed[quiet, j]
    n = int(per_step.size)
    if n >= 2:
        return float(per_step.sum() - per_step.max()) * n / (n - 1)
    if n == 0:
        return 0.0
    per_inst = rnd.imposed[:, j]
    pos = per_inst[per_inst > 0]
    k = int(pos.size)
    if k < 2:
        return 0.0
    rest = float(pos.sum() - pos.max()) * k / (k - 1)
    return float(per_step.sum()) * rest / float(pos.sum())


def spike_share(nm: Named, mx: Matrix, th: StragglerThresholds) -> float:
    """Share of a rank's lateness that falls in its spike steps (steps more than
    ``spike_factor`` times its median step); 0 with fewer than ``min_steps_confident`` steps.
    The lateness is the wait it imposes per step, or, for a rank found steadily late
    (``steadily_late``), its per-step skew behind the others: such a rank is last only when the
    host's jitter lets it be, so the wait it imposes comes in a few steps however steady its
    delay, and only its skew tells a steady delay from one made of spikes."""
    if nm.steady is not None and nm.steady.late:
        return _spike_share(np.clip(nm.steady.skews, 0.0, None), th)
    # with the other named ranks fixed: in its own naming round a straggler that alternates
    # with another as the last one imposes only where it beat it, which reads as spikes
    per_step = (
        nm.rnd.step_imposed[:, mx.ranks.index(nm.rank)] if nm.alone_imposed is None else nm.alone_imposed
    )
    return _spike_share(per_step, th)


def _spike_share(per_step: np.ndarray, th: StragglerThresholds) -> float:
    """``spike_share`` of one per-step lateness series."""
    med = float(np.median(per_step)) if per_step.size else 0.0
    if len(per_step) < th.min_steps_confident or med <= 0 or per_step.sum() <= 0:
        return 0.0
    return float(per_step[per_step > th.spike_factor * med].sum() / per_step.sum())


def pattern_of(persistent: list[Named], skew_spikes: list[Named], mx: Matrix, th: StragglerThresholds) -> str:
    if skew_spikes:
        return "steady skew with spikes"
    if not persistent:
        return "bursts"
    if any(spike_share(nm, mx, th) > 0 for nm in persistent):
        return "steady with spikes"
    return "steady"
