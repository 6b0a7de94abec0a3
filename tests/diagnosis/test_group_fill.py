"""The overlap test and the equal-size split of ``kinetoscope.diagnosis.group_fill``."""

from __future__ import annotations

import numpy as np

from kinetoscope.diagnosis import group_fill


def _a(*v: int) -> np.ndarray:
    return np.asarray(v, dtype=np.int64)


def test_members_hold_every_instance_at_once_and_one_miss_in_ten_is_allowed() -> None:
    lane_a, lane_e = _a(0, 100, 200, 300), _a(50, 150, 250, 350)
    # a member arrives late (after the lane's arrival) and ends with it: always overlapping
    assert group_fill.holds(lane_a, lane_e, _a(40, 140, 240, 340), _a(52, 151, 252, 351))
    # touching counts: the last arrival is the moment every member holds the instance
    assert group_fill.holds(lane_a, lane_e, _a(50, 150, 250, 350), _a(60, 160, 260, 360))
    # one instance without a counterpart (the trace window's edge) is allowed, two are not
    assert group_fill.holds(lane_a, lane_e, _a(140, 240, 340), _a(151, 252, 351))
    assert not group_fill.holds(lane_a, lane_e, _a(240, 340), _a(252, 351))
    # a rank whose collectives run between the lane's never shares an instance with it
    assert not group_fill.holds(lane_a, lane_e, _a(60, 160, 260, 360), _a(90, 190, 290, 390))
    assert not group_fill.holds(lane_a, lane_e, _a(), _a())


def test_the_split_is_the_cheapest_of_feasible_pairs_only() -> None:
    pair = lambda a, b: frozenset((a, b))  # noqa: E731
    cost = {
        pair(0, 1): 1.0,
        pair(2, 3): 1.0,
        pair(0, 2): 5.0,
        pair(1, 3): 5.0,
        pair(0, 3): 9.0,
        pair(1, 2): 9.0,
    }
    every = set(cost)
    assert group_fill.split_equal([0, 1, 2, 3], 2, every, cost) == [[0, 1], [2, 3]]
    # the cheapest pair is not feasible (its collectives never overlap): the next cheapest split
    assert group_fill.split_equal([0, 1, 2, 3], 2, every - {pair(0, 1)}, cost) == [[0, 2], [1, 3]]
    # no partition into feasible pairs, a size that does not divide the ranks, a group of one
    assert group_fill.split_equal([0, 1, 2, 3], 2, {pair(0, 1), pair(0, 2)}, cost) is None
    assert group_fill.split_equal([0, 1, 2], 2, every, cost) is None
    assert group_fill.split_equal([0, 1], 1, every, cost) is None
    # groups of three: every pair of each group must be feasible
    six = {pair(a, b) for a in range(6) for b in range(a + 1, 6)} - {pair(0, 3)}
    got = group_fill.split_equal(list(range(6)), 3, six, {})
    assert got is not None and all(not {0, 3} <= set(g) for g in got)


def test_a_search_too_large_gives_up_instead_of_running_on() -> None:
    # 64 ranks left, groups of 8, every pair feasible: C(63, 7) first groups alone
    every = {frozenset((a, b)) for a in range(64) for b in range(a + 1, 64)}
    assert group_fill.split_equal(list(range(64)), 8, every, {}) is None
    # a small one within the budget still splits
    assert group_fill.split_equal(list(range(8)), 4, {p for p in every if max(p) < 8}, {}) is not None


def test_the_largest_equal_groups_that_overlap_are_the_split() -> None:
    every8 = {frozenset((a, b)) for a in range(8) for b in range(a + 1, 8)}
    # every pair overlaps: one group (a job-wide group is not split up)
    assert group_fill.split_largest(list(range(8)), every8, {}) == [list(range(8))]
    # two groups of four whose collectives never overlap each other's
    halves = {p for p in every8 if len({x // 4 for x in p}) == 1}
    assert group_fill.split_largest(list(range(8)), halves, {}) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # four of the ranks overlap only their own partner: no group of four holds, pairs do
    late = {4, 5, 6, 7}
    pairs = {p for p in every8 if len(p & late) < 2}
    got = group_fill.split_largest(list(range(8)), pairs, {})
    assert got is not None and all(len(g) == 2 and len(set(g) & late) == 1 for g in got)
    # no pair can be formed, or a size that divides nothing: no split
    assert group_fill.split_largest([0, 1, 2, 3], set(), {}) is None
    assert group_fill.split_largest([0, 1, 2], {frozenset((0, 1))}, {}) is None


def test_the_largest_split_does_not_guess_a_smaller_size_when_the_search_gives_up(
    monkeypatch,
) -> None:
    every = {frozenset((a, b)) for a in range(12) for b in range(a + 1, 12)}
    monkeypatch.setattr(group_fill, "SEARCH_BUDGET", 3)
    # 12 ranks, all overlapping: one group is found at once, within any budget
    assert group_fill.split_largest(list(range(12)), every, {}) == [list(range(12))]
    # without the pair (0, 11) no group of 12 holds; groups of 6 take more than 3 tries: no
    # split, rather than one of smaller groups that were never compared with groups of 6
    assert group_fill.split_largest(list(range(12)), every - {frozenset((0, 11))}, {}) is None
