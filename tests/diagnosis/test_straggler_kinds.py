"""The one taxonomy of straggler kinds (``stragglers.kinds``), shared by the verdict and the
benchmark's labels."""

from __future__ import annotations

from kinetoscope.diagnosis.stragglers.kinds import is_rotating, job_kind, rank_kind


def test_rank_kind_is_persistent_beyond_half_of_the_steps():
    assert rank_kind(9, 16) == "persistent" and rank_kind(8, 16) == "intermittent"
    assert rank_kind(1, 1) == "persistent"  # a one-step trace
    assert rank_kind(1, 2) == "intermittent"  # one step of two is no steady delay


def test_stalls_moving_between_ranks_are_rotating():
    assert job_kind({0: [4], 1: [0, 1, 6], 3: [12]}, 16) == "rotating"
    assert job_kind({0: [2], 2: [5], 3: [9]}, 16) == "rotating"
    assert job_kind({1: [3, 9], 2: [5]}, 16) == "rotating"  # two thirds on one rank: still moving


def test_a_specific_rank_stalling_is_intermittent():
    assert job_kind({1: [3, 5, 9, 12]}, 16) == "intermittent"  # one rank
    assert job_kind({1: [3, 5, 9, 12], 2: [7]}, 16) == "intermittent"  # one rank holds 4 of 5
    assert job_kind({1: [3], 2: [3]}, 16) == "intermittent"  # two stalls: no pattern
    assert not is_rotating({0: [0], 1: [0], 2: [0]})  # one step: nothing moved
    # ranks late in the same steps are late together (three slow ranks of five), not rotating
    assert job_kind(
        {4: [1, 2, 4, 5, 7, 12, 13], 2: [0, 3, 6, 8, 10, 11, 14], 1: [3, 6, 8, 10, 11, 14, 15]}, 16
    ) == ("intermittent")


def test_persistent_and_mixed_and_none():
    assert job_kind({}, 16) == "none" and job_kind({1: []}, 16) == "none"
    assert job_kind({0: range(16), 3: range(16)}, 16) == "persistent"
    assert job_kind({0: range(16), 2: [3, 7, 11]}, 16) == "mixed"
