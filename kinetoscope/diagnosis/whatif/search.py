"""What-if replays: the job replayed with chosen local work made ideal, and the figures read off them.

Definitions (after *Understanding Stragglers in Large Model Training Using What-if Analysis*,
OSDI '25; our own code):

``T_obs`` / ``T_ideal``
    Mean step time of the replay with the observed durations / with every item (and every
    sync's transfer) at its ideal value, i.e. every lane working like the typical peer.
slowdown ``S``
    ``T_obs / T_ideal``: how much longer the job takes than if nobody straggled.
``S_w`` (per lane) / ``S_t`` (per operation type)
    ``T_add / T_ideal`` where ``T_add`` replays the ideal job with only lane ``w``'s (type
    ``t``'s) work at its observed durations: that lane's own slowdown, unmasked by others.
removal fraction ``rem`` of a selection
    ``(T_obs - T_rem) / (T_obs - T_ideal)``, ``T_rem`` the observed job with the selection made
    ideal: the part of the slowdown that fixing the selection recovers. It can exceed 1 when the
    selection was slower than ideal and the rest faster (e.g. the last pipeline stage).
``M_W`` / ``M_S``
    ``rem`` of the worst few workers (the top 3 %, at least one, by ``S_w``) / of the last
    pipeline stage: worker issues and stage-partitioning imbalance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kinetoscope.diagnosis.whatif.model import F64, I64, B, ReplayModel, typical
from kinetoscope.diagnosis.whatif.replay import Schedule, build_schedule, incidence_work, replay

_CHUNK_ELEMS = 16_000_000  # scenarios x incidences per replay call: bounds memory
MIN_GAIN = 0.02  # the search names a further option only when it saves this share of step time


@dataclass(frozen=True)
class Scenario:
    """One what-if: start from ideal (``from_ideal``) or observed, and flip the selected parts."""

    from_ideal: bool
    items: B  # items whose duration is flipped to the other side
    transfers: B  # incidences whose transfer is flipped


@dataclass
class WhatIf:
    """Replays of one model; caches the observed and ideal replays."""

    model: ReplayModel
    schedule: Schedule = field(init=False)
    t_obs: F64 = field(init=False)  # step times, observed durations
    t_ideal: F64 = field(init=False)  # step times, all ideal

    def __post_init__(self) -> None:
        self.schedule = build_schedule(self.model)
        none_i = np.zeros(self.model.item_work.shape[0], dtype=bool)
        none_s = np.zeros(self.model.inc_lane.shape[0], dtype=bool)
        both = self.run([Scenario(False, none_i, none_s), Scenario(True, none_i, none_s)])
        self.t_obs, self.t_ideal = both[0], both[1]

    def run(self, scenarios: Sequence[Scenario], ideal: F64 | None = None) -> F64:
        """Step times of each scenario (scenarios x steps), in memory-bounded chunks; ``ideal``:
        the items' ideal durations (default: the model's, the typical peer's)."""
        m = self.model
        item_ideal = m.item_ideal if ideal is None else ideal
        chunk = max(1, _CHUNK_ELEMS // max(1, m.inc_lane.shape[0]))
        out = []
        for i in range(0, len(scenarios), chunk):
            part = scenarios[i : i + chunk]
            ideal_i = np.stack([s.items ^ s.from_ideal for s in part], axis=1)
            ideal_s = np.stack([s.transfers ^ s.from_ideal for s in part], axis=1)
            items = np.where(ideal_i, item_ideal[:, None], m.item_work[:, None])
            transfer = np.where(ideal_s, m.inc_ideal_transfer[:, None], m.inc_transfer[:, None])
            out.append(replay(m, self.schedule, incidence_work(m, items), transfer))
        return np.concatenate(out, axis=0) if out else np.zeros((0, m.n_steps))

    @property
    def slowdown(self) -> float:
        """``T_obs / T_ideal`` (1.0 = no slowdown)."""
        return float(self.t_obs.mean() / max(self.t_ideal.mean(), 1e-12))

    def lane_items(self, lanes: Sequence[int]) -> B:
        """Items of the given lanes."""
        return self._lane_mask(lanes)[self.model.item_lane]

    def _lane_mask(self, lanes: Sequence[int]) -> B:
        mask = np.zeros(self.model.n_lanes, dtype=bool)
        mask[np.asarray(lanes, dtype=np.int64)] = True
        return mask

    def lane_transfers(self, lanes: Sequence[int]) -> B:
        """Incidences of syncs whose members are all among the given lanes: their transfers are
        the selection's.

        (A transfer shared with a lane outside the selection stays observed: the selection alone
        cannot make it faster.)
        """
        sel = np.ones(self.model.n_syncs, dtype=bool)
        inc = self._lane_mask(lanes)[self.model.inc_lane]
        np.logical_and.at(sel, self.model.inc_sync, inc)
        return np.asarray(sel[self.model.inc_sync], dtype=np.bool_)

    def selection(self, lanes: Sequence[int], with_transfer: bool) -> tuple[B, B]:
        """(items, transfers) of a lane set; transfers only when they are part of the what-if."""
        n_inc = self.model.inc_lane.shape[0]
        tr = self.lane_transfers(lanes) if with_transfer else np.zeros(n_inc, dtype=bool)
        return self.lane_items(lanes), tr

    def removal(self, selections: Sequence[tuple[B, B]]) -> tuple[F64, F64]:
        """``rem`` and ``add`` fractions of each selection (see the module docstring)."""
        scen = [Scenario(False, i, s) for i, s in selections]
        scen += [Scenario(True, i, s) for i, s in selections]
        times = self.run(scen).mean(axis=1)
        n = len(selections)
        t_obs, t_ideal = float(self.t_obs.mean()), float(self.t_ideal.mean())
        gap = t_obs - t_ideal
        if abs(gap) < 1e-12:
            zeros = np.zeros(n)
            return zeros, zeros.copy()
        return (t_obs - times[:n]) / gap, (times[n:] - t_ideal) / gap

    def per_lane_add(
        self, lanes: Sequence[int], with_transfer: bool = False, ideal: F64 | None = None
    ) -> F64:
        """Step times (lanes x steps) with only each lane's work observed (add direction)."""
        scen = [Scenario(True, *self.selection([w], with_transfer)) for w in lanes]
        return self.run(scen, ideal)

    def per_label(self) -> dict[str, float]:
        """``S_t`` per operation type present: ideal job with that type's items observed."""
        m = self.model
        codes = np.unique(m.item_label)
        none_s = np.zeros(m.inc_lane.shape[0], dtype=bool)
        scen = [Scenario(True, m.item_label == c, none_s) for c in codes]
        times = self.run(scen).mean(axis=1)
        base = max(float(self.t_ideal.mean()), 1e-12)
        return {m.labels[int(c)]: float(t / base) for c, t in zip(codes, times, strict=True)}


@dataclass(frozen=True)
class Explanation:
    """The smallest lane set whose idealisation recovers most of the slowdown.

    ``candidates`` (most costly first) carry their own cost per step: ``cost[i, s]`` is lane
    ``candidates[i]``'s ``T_add / T_ideal - 1`` in step ``s`` (its slowdown when it alone is
    observed), against the ideal it is measured with (``t_ideal[i]``: that ideal job's step
    times; see ``explain``). ``lanes``: the explaining set in naming order; ``gains[i]``: what naming
    ``lanes[i]`` saved, as a share of the observed step time (members of a tie share it);
    ``option_gains[i]``: what the what-if that named ``lanes[i]`` saved (its whole tie's saving:
    a tie of four ranks slowed together is one problem, whose members each carry a quarter).
    """

    candidates: tuple[int, ...]
    cost: F64  # candidates x steps
    lanes: tuple[int, ...]
    gains: tuple[float, ...]
    recovered_fraction: float  # rem of the explaining set (0 when empty)
    t_ideal: F64  # candidates x steps: step times of the ideal job each cost is measured against
    option_gains: tuple[float, ...] = ()

    def own_cost(self, lane: int) -> float:
        """Mean own cost of a candidate lane (0 when not a candidate)."""
        if lane not in self.candidates:
            return 0.0
        return float(self.cost[self.candidates.index(lane)].mean())


def member_groups(model: ReplayModel) -> I64:
    """Per item, its typical-peer group in a model whose ideal is the members' (Kineto jobs
    without paired transfers): the members of its collective instance; for a step's tail, every
    rank's tail of that step."""
    inc = model.item_inc
    sync = model.inc_sync[inc]
    return np.where(model.sync_is_end[sync], model.n_syncs + model.inc_step[inc], sync).astype(np.int64)


def groups_per_lane(model: ReplayModel) -> I64:
    """Per lane, how many different member sets (process groups, transfer pairs) the syncs it
    visits have, step ends left out."""
    rng = np.random.default_rng(0)
    weight = rng.integers(1, 2**62, size=model.n_lanes, dtype=np.int64)
    multi = ~model.sync_is_end[model.inc_sync]
    lane, sync = model.inc_lane[multi], model.inc_sync[multi]
    sig = np.zeros(model.n_syncs, dtype=np.int64)
    np.add.at(sig, sync, weight[lane])  # wraps: a hash of the member set
    salt = rng.integers(1, 2**62, size=model.n_lanes, dtype=np.int64)
    _, first = np.unique(sig[sync] ^ salt[lane], return_index=True)  # one per (lane, member set)
    return np.bincount(lane[first], minlength=model.n_lanes).astype(np.int64)


def ideal_without(model: ReplayModel, groups: I64, lanes: Sequence[int]) -> F64:
    """The typical peer re-evaluated without ``lanes`` where they could have made it slow: in a
    group of ``n`` members of which ``k`` are among ``lanes``, once ``k + 1`` slow members would
    reach the model's lower median (``k >= n - (n - 1) // 2 - 1``), the median of the other
    members' work, never above the model's ideal; elsewhere (where fewer than three members are
    left, and for ``item_unattributed`` items) the model's ideal.

    Why: the model's ideal is the lower median of every member, a yardstick only while most
    members are healthy. With three slow ranks of five (two persistent, one stalling now and
    then) the median of a stalled step is the stalling rank itself, and it costs nothing
    against it. Ranks already named are by definition not the typical peer, so where they and
    one more slow rank would make the median, the yardstick is taken from the others. A fixed
    low quantile (the fastest member, say) would need no search, but on a loaded host it
    charges every rank the spread of the noise (the fastest of N draws); where a minority is
    named the model's median is still a healthy rank's and is kept, so the noise floor moves
    only where the median would otherwise be a straggler's.
    """
    if not len(lanes):
        return model.item_ideal
    named = np.isin(model.item_lane, np.asarray(lanes, dtype=np.int64))
    size = np.bincount(groups)
    k = np.bincount(groups[named], minlength=size.shape[0])
    moved = (k >= size - (size - 1) // 2 - 1) & (size - k >= 3)  # a median of three others at least
    rest = ~named & moved[groups]
    if not rest.any():
        return model.item_ideal
    med = np.full(size.shape[0], np.inf)
    med[groups[rest]] = typical(model.item_work[rest], groups[rest], how="median")
    moved_ideal = np.where(
        model.item_unattributed, model.item_ideal, np.minimum(model.item_ideal, med[groups])
    )
    return np.asarray(moved_ideal, dtype=np.float64)


def excess_work(model: ReplayModel, ideal: F64 | None = None) -> F64:
    """Per lane: local work above the typical peer's, summed (a cheap pre-filter)."""
    base = model.item_ideal if ideal is None else ideal
    over = np.maximum(model.item_work - base, 0.0)
    return np.bincount(model.item_lane, weights=over, minlength=model.n_lanes).astype(np.float64)


def candidates(w: WhatIf, max_candidates: int = 8, min_excess_share: float = 0.2) -> tuple[list[int], F64]:
    """Lanes worth replaying and their own cost per step, most costly first (against the
    model's ideal; ``candidates_at``)."""
    cand, cost, _ = candidates_at(w, max_candidates, min_excess_share)
    return cand, cost


def candidates_at(
    w: WhatIf,
    max_candidates: int = 8,
    min_excess_share: float = 0.2,
    ideal: F64 | None = None,
    keep: Sequence[int] = (),
) -> tuple[list[int], F64, F64]:
    """Lanes worth replaying, their own cost per step (most costly first), and the ideal job's
    step times the costs are measured against.

    The ``max_candidates`` lanes with the most excess work (at least ``min_excess_share`` of the
    largest: a cheap pre-filter), and the ``keep`` lanes, each replayed alone on the ideal job
    (add direction), which shows a straggler even when a bigger one masks it in the observed job.
    """
    m = w.model
    t_ideal = w.t_ideal
    if ideal is not None:
        none_i = np.zeros(m.item_work.shape[0], dtype=bool)
        t_ideal = w.run([Scenario(True, none_i, np.zeros(m.inc_lane.shape[0], dtype=bool))], ideal)[0]
    excess = excess_work(m, ideal)
    floor = max(float(excess.max(initial=0.0)) * min_excess_share, 1e-300)
    top = np.argsort(-excess, kind="stable")[:max_candidates]
    order = list(keep) + [int(x) for x in top if excess[x] >= floor and int(x) not in keep]
    if not order:
        return [], np.zeros((0, m.n_steps)), t_ideal
    cost = w.per_lane_add(order, ideal=ideal) / np.maximum(t_ideal, 1e-12)[None, :] - 1.0
    rank = np.argsort(-cost.mean(axis=1), kind="stable")
    return [order[i] for i in rank], cost[rank], t_ideal


def explain(
    w: WhatIf,
    max_candidates: int = 8,
    min_gain: float = MIN_GAIN,
    tie: float = 0.8,
    per_round: int = 4,
    max_rounds: int = 8,
    groups: I64 | None = None,
) -> Explanation:
    """Set-level what-if search: greedy removal with shared ties.

    Round by round, with the lanes named so far made ideal, each of the ``per_round`` most
    costly remaining candidates is made ideal too, and so is the *tie*: the most costly one with
    every candidate whose own cost is within ``tie`` of it (when it is itself within ``tie`` of
    the first named lane). Two equal stragglers mask each other (fixing one alone saves nothing);
    fixed together they do, so both are named. The option saving the most step time is named (a
    tie only when it saves ``min_gain`` per extra lane more than the best single lane,
    ``_best_option``); the search stops when it saves less than ``min_gain`` of the observed step
    time.

    ``groups`` (``member_groups``): re-evaluate the ideal without the named lanes after each
    round (``ideal_without``), and the candidates' own costs against it, so a rank stalling
    beside a slow majority is measured against the healthy ranks.
    """
    ideal = w.model.item_ideal
    cand, cost, t_ideal = candidates_at(w, max_candidates)
    t_obs = float(w.t_obs.mean())
    t_cur = t_obs
    named: list[int] = []
    gains: list[float] = []
    option_gains: list[float] = []
    for _ in range(max_rounds):
        own = {c: float(cost[i].mean()) for i, c in enumerate(cand)}
        options = _options([c for c in cand if c not in named], own, named, tie, per_round)
        if not options:
            break
        scen = [Scenario(False, *w.selection(named + opt, with_transfer=False)) for opt in options]
        times = w.run(scen, ideal).mean(axis=1)
        best = _best_option(options, t_cur - times, min_gain * t_obs)
        gain = (t_cur - float(times[best])) / max(t_obs, 1e-12)
        if gain < min_gain:
            break
        named += options[best]
        gains += [gain / len(options[best])] * len(options[best])
        option_gains += [gain] * len(options[best])
        t_cur = float(times[best])
        new = ideal if groups is None else ideal_without(w.model, groups, named)
        if not np.array_equal(new, ideal):  # the yardstick moved: costs measured against it again
            ideal = new
            cand, cost, t_ideal = candidates_at(w, max_candidates, ideal=ideal, keep=named)
            t_cur = float(w.run([Scenario(False, *w.selection(named, with_transfer=False))], ideal).mean())
    gap = t_obs - float(t_ideal.mean())
    rec = (t_obs - t_cur) / gap if named and gap > 0 else 0.0
    base = np.repeat(t_ideal[None, :], len(cand), axis=0)
    if groups is not None and len(named) > 1:
        _own_against_others(w, groups, named, (cand, cost, base), ideal)
    return Explanation(tuple(cand), cost, tuple(named), tuple(gains), float(rec), base, tuple(option_gains))


def _own_against_others(
    w: WhatIf, groups: I64, named: list[int], rows: tuple[list[int], F64, F64], final: F64
) -> None:
    """Each named lane's own cost (in place) against the ideal without the *other* named lanes:
    a rank is compared with the peers that are not the other stragglers, not with a yardstick
    its own exclusion lowered (one stall beside a persistent rank would otherwise read as late
    in the steps its stall spilled into). ``rows``: candidates, their costs and ideal step
    times, measured against ``final`` (a lane whose ideal is the same keeps its row)."""
    cand, cost, base = rows
    for lane in named:
        ideal = ideal_without(w.model, groups, [x for x in named if x != lane])
        if np.array_equal(ideal, final):
            continue
        none_i = np.zeros(w.model.item_work.shape[0], dtype=bool)
        none_s = np.zeros(w.model.inc_lane.shape[0], dtype=bool)
        times = w.run([Scenario(True, none_i, none_s), Scenario(True, *w.selection([lane], False))], ideal)
        i = cand.index(lane)
        base[i] = times[0]
        cost[i] = times[1] / np.maximum(times[0], 1e-12) - 1.0


def _best_option(options: list[list[int]], saved: F64, bar: float) -> int:
    """Index of the option saving the most, where beside a single lane that saves ``bar`` a tie
    of ``k`` lanes counts only when it saves ``bar`` per extra lane more than that lane: a tie
    always saves at least as much as its best member, so without this a lane whose own work is
    only noise rides along with a real straggler. (Where no lane alone saves ``bar``, the tie is
    judged whole: ranks slowed together that only save when fixed together.)"""
    single = max((float(g) for o, g in zip(options, saved, strict=True) if len(o) == 1), default=0.0)
    worth = [
        len(o) == 1 or single < bar or float(g) - single >= bar * (len(o) - 1)
        for o, g in zip(options, saved, strict=True)
    ]
    return int(np.argmax(np.where(worth, saved, -np.inf)))


def _options(
    rest: list[int], own: dict[int, float], named: list[int], tie: float, per_round: int
) -> list[list[int]]:
    """This round's what-ifs: the most costly remaining candidates alone, and their tie."""
    if not rest:
        return []
    opts = [[c] for c in rest[:per_round]]
    top = rest[0]
    ref = own[named[0]] if named else own[top]
    if own[top] > 0 and own[top] >= tie * ref:
        unit = [c for c in rest if own[c] >= tie * own[top]]
        if len(unit) > 1:
            opts.append(unit)
    return opts
