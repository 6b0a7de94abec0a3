"""Split the ranks left without a confirmed process group into equal groups.

Group inference (``groups``) reads a lane's members from which ranks' collectives end together.
On a loaded host the members of a small group can end a few ms apart, as far as the next
group's ranks, and then their lanes give no confirmed group. When the confirmed groups of the
same mesh dimension all have ``k`` ranks, the ranks left must form groups of ``k`` too
(``split_equal``); when no group of that dimension is confirmed, the size is the largest whose
split holds (``split_largest``: all the ranks in one group when every pair overlaps). This
module picks the split.

Terms:

* **interval** of a collective on a rank: from its arrival to its end.
* **overlap** of a lane with a rank ``q``: the fraction of the lane's intervals that overlap
  some interval of ``q``. The members of one collective instance all hold it from their own
  arrival to the moment the last member arrived at least (no member can finish before every
  member has joined), so on one clock two members' intervals always overlap: a pair of ranks
  whose intervals do not is not one group, however close their ends.
* **feasible** pair: each rank's lane overlaps the other rank in all but 1 in 10 of its
  instances, at least one (``OVERLAP_MISSES_PER_10``: an instance at the edge of a trace window
  may lack its counterpart).
* **cost** of a group: the sum over its pairs of the larger of the two median distances from
  one rank's lane ends to the other rank's nearest ends (the statistic inference ranks
  members by).

The split chosen is the partition of the left ranks into groups of ``k`` whose every pair is
feasible, of least total cost; none when no such partition exists or the search tries more
than ``SEARCH_BUDGET`` groups (the ranks then stay job-wide, as before groups were known).
Without ``k``, the sizes that divide the ranks are tried from all of them down to 2; a search
that gives up ends the trial with no split (a smaller size would be a guess).
"""

from __future__ import annotations

import itertools

import numpy as np

# Instances of a lane allowed without an overlapping interval on a member, per 10 instances
# (at least one).
OVERLAP_MISSES_PER_10 = 1
SEARCH_BUDGET = 20_000


def holds(lane_arrival: np.ndarray, lane_end: np.ndarray, arrival: np.ndarray, end: np.ndarray) -> bool:
    """Whether the lane's intervals overlap the intervals ``arrival..end`` of another rank in
    all but the allowed misses (module docstring, "feasible")."""
    if lane_end.size == 0 or end.size == 0:
        return False
    order = np.argsort(arrival, kind="stable")
    starts, reach = arrival[order], np.maximum.accumulate(end[order])
    # intervals starting before the lane's interval ends; the latest end among them must reach it
    k = np.searchsorted(starts, lane_end, side="right") - 1
    hit = (k >= 0) & (reach[np.maximum(k, 0)] >= lane_arrival)
    misses = int(lane_end.size - np.count_nonzero(hit))
    return misses <= max(1, lane_end.size * OVERLAP_MISSES_PER_10 // 10)


def split_equal(
    ranks: list[int], k: int, feasible: set[frozenset[int]], cost: dict[frozenset[int], float]
) -> list[list[int]] | None:
    """The least-cost partition of ``ranks`` into groups of ``k`` whose pairs are all in
    ``feasible`` (module docstring), or None."""
    return _search(ranks, k, feasible, cost)[0]


def split_largest(
    ranks: list[int], feasible: set[frozenset[int]], cost: dict[frozenset[int], float]
) -> list[list[int]] | None:
    """The split of ``ranks`` into the largest equal groups (``split_equal``) that exists:
    every rank in one group when every pair is feasible, else the largest size below that
    divides them; None when not even pairs exist, or when a search gives up (a smaller size
    would then be a guess: the larger one was not ruled out)."""
    n = len(ranks)
    for k in sorted((k for k in range(2, n + 1) if n % k == 0), reverse=True):
        got, gave_up = _search(ranks, k, feasible, cost)
        if gave_up:
            return None
        if got is not None:
            return got
    return None


def _search(
    ranks: list[int], k: int, feasible: set[frozenset[int]], cost: dict[frozenset[int], float]
) -> tuple[list[list[int]] | None, bool]:
    """``split_equal``'s partition (or None), and whether the search gave up on its budget."""
    if k < 2 or not ranks or len(ranks) % k:
        return None, False
    best: list[tuple[float, list[list[int]]]] = []
    budget = [SEARCH_BUDGET]

    def walk(left: list[int], done: list[list[int]], spent: float) -> bool:
        if best and spent >= best[0][0]:
            return True
        if not left:
            best[:] = [(spent, [list(g) for g in done])]
            return True
        head, rest = left[0], left[1:]
        partners = [r for r in rest if frozenset((head, r)) in feasible]
        for others in itertools.combinations(partners, k - 1):
            budget[0] -= 1  # every group tried counts: C(63, 7) of them would never end
            if budget[0] < 0:
                return False
            group = (head, *others)
            pairs = [frozenset(p) for p in itertools.combinations(group, 2)]
            if all(p in feasible for p in pairs):
                more = sum(cost.get(p, 0.0) for p in pairs)
                remaining = [r for r in rest if r not in others]
                if not walk(remaining, [*done, list(group)], spent + more):
                    return False
        return True

    if not walk(sorted(ranks), [], 0.0):
        return None, True
    return (best[0][1] if best else None), False
