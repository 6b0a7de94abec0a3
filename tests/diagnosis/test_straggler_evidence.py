"""The evidence a straggler verdict shows, on re-timed real GPU traces (issue 9).

Scenarios come from the benchmark's generator (``benchmarks/diag_scenarios/gpu.py``) on the
in-repository real traces; labels are checked against the standard-library arrival-order
ground truth (``truth.py``), not against the product.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import polars as pl
import pytest

from benchmarks.diag_scenarios import gpu, truth
from kinetoscope.diagnosis import diagnose
from kinetoscope.diagnosis.stragglers.verdict import StragglerThresholds


def _build(tmp_path: Path, stype: str, base: str, world: int, seed: int) -> tuple[gpu.Scenario, list[str]]:
    sc = gpu.make_scenario(stype, base, world, seed)
    paths = [str(p) for p in gpu.build(sc, tmp_path / sc.sid)]
    assert gpu.truth_agrees(sc, truth.ground_truth(paths)), sc.sid
    return sc, paths


def test_a_steady_rank_of_a_two_step_trace_keeps_its_effect(tmp_path):
    """Rank 2 is last at 7 of 9 collectives over 2 steps (chance 1/4) and imposes ~3 % of the
    step. The frequency route's effect size leaves out the rank's largest step so that one stall
    cannot lend it its size; dropping one of two steps used to halve a steady rank's effect
    (0.7 % < 1 %) and the rank went unnamed. Its late ends are switched off here
    (``link_min_ranks``): the arrivals alone must name it."""
    sc, paths = _build(tmp_path, "slow_link", "sampled128", 4, 18)
    s = diagnose(paths, thresholds=StragglerThresholds(link_min_ranks=99)).stragglers
    assert s.steps_analysed == 2 and s.kind == "persistent" and s.ranks == sc.ranks == [2], s.reason
    assert re.search(r"rank 2 last at \d/9 collectives", s.reason)


def test_a_rank_named_for_its_stalls_shows_its_stalls_not_a_chance(tmp_path):
    """Two ranks each stall beyond the noise (events at instances 12, 13, 14, 20). Named by
    magnitude, each segment gives its stalls; the last rank not named has no chance to be
    compared with ("chance 100%, p=1" read as evidence against it), so it shows none."""
    sc, paths = _build(tmp_path, "intermittent", "nccl_parser", 2, 2)
    s = diagnose(paths).stragglers
    assert s.kind == "intermittent" and sorted(s.ranks) == sc.ranks == [0, 1], s.reason
    assert "chance 100%" not in s.reason and "p=1" not in s.reason
    for r in (0, 1):
        m = re.search(
            rf"rank {r} (?:last at [^;]*?, )?stalled beyond the noise in (\d) step\(s\) \(up to ([\d.]+) ms\)",
            s.reason,
        )
        assert m, s.reason
        assert (
            float(m.group(2)) >= 0.2 * gpu.load_base("nccl_parser").step_us / 1000.0
        )  # injected: 20-60 % of a step


@pytest.mark.skipif(not gpu.DLRM8.is_dir(), reason=f"real DLRM job traces not found at {gpu.DLRM8}")
def test_a_microsecond_noise_sigma_is_not_shown_as_zero_ms(tmp_path):
    """A clean job built from the real DLRM trace has an arrival noise of a few µs (NCCL kernel
    starts): the verdict shows it in µs, not as "0.0 ms"."""
    _sc, paths = _build(tmp_path, "clean", "dlrm8", 4, 0)
    d = diagnose(paths)
    sigma = d.stragglers.sigma_us
    assert d.stragglers.kind == "none" and sigma is not None and 0 < sigma < 50
    line = d.verdict_lines()[1]
    assert f"noise sigma {sigma:.0f} µs" in line and "0.0 ms" not in line, line


def _stall_job(tmp_path: Path, stalls: dict[tuple[int, int], float]) -> list[str]:
    """A 2-rank job from the real ``nccl_parser`` trace (3 steps, 21 collectives) with stalls
    ``(rank, instance) -> fraction of a step`` and a little jitter."""
    base = gpu.load_base("nccl_parser")
    plan = gpu.Plan.empty(2, base.n, jitter_mean_us=0.002 * base.step_us)
    for (r, i), frac in stalls.items():
        plan.delay[r, i] = frac * base.step_us
    return [str(p) for p in gpu.write_job(base, plan, random.Random(1), tmp_path)]


def test_one_small_stall_beside_a_recurrent_straggler_is_not_named(tmp_path):
    """Rank 1 stalls a whole step in 2 of the 3 steps; rank 0 stalls 0.3 of a step once, in the
    third (the demo's punctual rank descheduled once on a loaded host). With rank 1 fixed, rank 0
    is the last free rank and its one stall passes the event threshold, but it adds ~13 % of the
    lost time, under half of the mean cost of a stall (1/3): rank 1 alone explains the waiting.
    The same stall of rank 0 next to one stall of rank 1 of its own size is a pattern of two
    ranks, and both are named."""
    base = gpu.load_base("nccl_parser")
    step_of = base.step_of.tolist()
    first = {s: step_of.index(s) + 2 for s in range(3)}  # an instance inside each step
    paths = _stall_job(tmp_path / "recurrent", {(1, first[0]): 1.0, (1, first[1]): 1.0, (0, first[2]): 0.3})
    s = diagnose(paths).stragglers
    assert s.kind == "intermittent" and s.ranks == [1], s.reason
    assert [0] in s.per_step["late_ranks"].to_list()  # its stall is still shown in its step
    s = diagnose(paths, thresholds=StragglerThresholds(min_event_share=0.0)).stragglers
    assert sorted(s.ranks) == [0, 1]  # the former verdict
    paths = _stall_job(tmp_path / "pair", {(1, first[1]): 0.35, (0, first[2]): 0.3})
    s = diagnose(paths).stragglers
    assert s.kind == "intermittent" and sorted(s.ranks) == [0, 1], s.reason


def test_a_stall_of_a_fifth_of_a_step_is_named(tmp_path):
    """Rank 1 stalls 0.21 of a step once, beside ranks 2 and 0 (events at instances 2, 6, 7 of
    a 2-step, 4-rank job whose arrival noise is microseconds). The event threshold's step floor
    was a quarter of a step and left it out although the ground truth counts it; a fifth of a
    step of a quiet GPU job is thousands of sigma (docs/diagnosis-stragglers.md)."""
    sc, paths = _build(tmp_path, "intermittent", "sampled128", 4, 4)
    s = diagnose(paths).stragglers
    assert s.kind == "intermittent" and sorted(s.ranks) == sc.ranks == [0, 1, 2], s.reason
    s = diagnose(paths, thresholds=StragglerThresholds(rel_step_intermittent=0.25)).stragglers
    assert sorted(s.ranks) == [0, 2]  # the former floor's verdict


def test_a_compute_straggler_late_in_both_steps_of_a_short_trace_is_named(tmp_path):
    """Rank 3 computes slower in both steps of a 2-step trace and imposes 64-84 ms of a 720 ms
    step each time, beyond the persistent threshold (31 ms) but under the event threshold
    (94 ms, meant for a one-off stall); at 6 of 9 collectives (chance 28 %, p = 0.017) it is
    not last often enough for the frequency route over four ranks. Late beyond the persistent
    threshold in every step is a pattern that noise does not make: it was 'none'. (The label's
    sanity check fails here only because the jitter lets rank 2 impose 1.7 % of a step too.)"""
    sc = gpu.make_scenario("compute", "sampled128", 4, 2)
    paths = [str(p) for p in gpu.build(sc, tmp_path / sc.sid)]
    gt = truth.ground_truth(paths)
    assert gt.imposed_us[3] > 0.8 * sum(gt.imposed_us.values())  # the truth: rank 3 makes the waits
    s = diagnose(paths).stragglers
    assert s.steps_analysed == 2 and s.kind == "persistent" and s.ranks == sc.ranks == [3], s.reason
    assert re.search(r"rank 3 last at 6/9 collectives .*late by [\d.]+-[\d.]+ ms in every step", s.reason)
    row = s.per_rank.filter(pl.col("rank") == 3).row(0, named=True)
    assert row["role"] == "persistent" and row["late_steps"] == 2


def test_a_pair_late_together_in_both_steps_of_a_short_trace_is_persistent(tmp_path):
    """Ranks 2 and 3 (one node) stall alike in both steps of a 2-step trace, 37 % of the step.
    Either of the two is the last one at 9 of 10 collectives, against a chance of 56 %: the
    instance binomial called that chance, and they were 'intermittent'. As the two latest
    together they are far beyond chance, and the reason now shows that evidence rather than
    each rank's own last count (rank 3 at 2 of 10: it contradicted the verdict)."""
    sc, paths = _build(tmp_path, "node", "sampled128", 4, 13)
    s = diagnose(paths).stragglers
    assert s.steps_analysed == 2 and s.kind == "persistent", s.reason
    assert sorted(s.ranks) == sc.ranks == [2, 3] and s.intermittent_ranks == []
    assert re.search(r"ranks 2, 3 the 2 latest together at (\d+)/10 collectives", s.reason), s.reason
    assert "rank 3 last at" not in s.reason


def test_a_rank_stalling_once_in_each_of_two_steps_stays_intermittent(tmp_path):
    """Rank 4 of 8 stalls at one collective in each of the 2 steps: beyond the persistent
    threshold in every step, but last at 2 of 9 collectives. Being named for every step must not
    make a burst persistent."""
    sc, paths = _build(tmp_path, "intermittent", "sampled128", 8, 13)
    s = diagnose(paths).stragglers
    assert s.kind == "intermittent" and sorted(s.intermittent_ranks) == sc.ranks == [4, 5], s.reason


def test_the_first_of_two_late_ranks_of_a_short_trace_at_64_ranks_is_persistent(tmp_path):
    """Ranks 33 and 41 of 64 are both a third of a step late at every collective of a 2-step
    trace, and take turns as the last one. Rank 33, named first, was the last one at 4 of 9
    collectives in its round, under half, so it was 'intermittent' beside 'persistent [41]'
    though it costs more. With rank 41 fixed it is the last one at 8 of 9: judged, as its late
    steps are, on both rounds, it is persistent."""
    sc, paths = _build(tmp_path, "persistent2", "sampled128", 64, 0)
    gt = truth.ground_truth(paths)
    assert gt.latest_set_count({33, 41}) >= 8  # the truth: the two latest at 8 or 9 of 9
    s = diagnose(paths).stragglers
    assert s.steps_analysed == 2 and s.kind == "persistent", s.reason
    assert sorted(s.ranks) == sc.ranks == [33, 41] and s.intermittent_ranks == []


@pytest.mark.skipif(not gpu.DLRM8.is_dir(), reason=f"real DLRM job traces not found at {gpu.DLRM8}")
def test_two_near_equal_stalls_of_a_one_step_trace_are_both_named(tmp_path):
    """A fresh seed of the benchmark (``--gpu-seed 7``): ranks 0 and 3 of the DLRM job on 4 ranks
    (one step, 8 collectives) each stall once, by about the same (4.1 and 4.6 ms). The rules
    name rank 0 and list rank 3 beside it; the replay ties them (24.6 % of step time each). A
    co-straggler must recur (late in 3 steps), which a one-step trace cannot show, so rank 3
    was left out: it must now be late in every step of a trace shorter than that."""
    sc, paths = _build(tmp_path, "intermittent", "dlrm8", 4, 7001)
    assert sc.ranks == [0, 3]
    s = diagnose(paths).stragglers
    assert s.steps_analysed == 1 and sorted(s.ranks) == [0, 3], s.reason


@pytest.mark.skipif(not gpu.DLRM8.is_dir(), reason=f"real DLRM job traces not found at {gpu.DLRM8}")
def test_a_rank_joined_in_a_one_step_trace_keeps_the_kind_of_its_collectives(tmp_path):
    """A fresh seed (``--gpu-seed 17``): on the DLRM job on 4 ranks (one step, 8 collectives)
    rank 1 stalls at 3 collectives and rank 3 at one. The rules name rank 1 intermittent; the
    replay joins rank 3. Late in the only step, both read as persistent by steps, which a one-step
    trace cannot tell; by their collectives (last at 4 and 3 of 8) both are intermittent."""
    sc, paths = _build(tmp_path, "intermittent", "dlrm8", 4, 17001)
    assert sc.ranks == [1, 3] and sc.kind == "intermittent"
    s = diagnose(paths).stragglers
    assert s.steps_analysed == 1 and sorted(s.ranks) == [1, 3], s.reason
    assert s.kind == "intermittent" and sorted(s.intermittent_ranks) == [1, 3], s.kind


def test_a_rank_late_by_its_delay_in_every_step_of_a_short_trace_is_persistent(tmp_path):
    """Rank 1 of 2 ends its collectives ~20 ms late (a slow link) in each of 3 steps. Last at
    15 of 21 collectives is what chance gives one of two ranks 4 % of the time, so the count
    alone cannot rule chance out; late beyond the noise's persistent threshold in every step,
    its size does (``naming.is_persistent``)."""
    sc, paths = _build(tmp_path, "slow_link", "nccl_parser", 2, 12002)
    s = diagnose(paths).stragglers
    assert s.steps_analysed == 3 and s.kind == "persistent" and s.ranks == sc.ranks == [1], s.reason
    assert "in every step" in s.reason


def test_every_rank_of_a_slow_node_is_named(tmp_path):
    """Ranks 4-7 of 8 (one host) each take ~19 % longer per step, two steps traced. The rules
    pair them two by two (4 and 6 together at 8 of 9 collectives, 5 and 7 at 4 of 9) and name
    4 and 6; the replay names all four as one tie saving 15 % of step time, 3.8 % each. A rank
    joins on what its what-if saved (``tie_cost``), not on its quarter of it."""
    sc, paths = _build(tmp_path, "node", "sampled128", 8, 12004)
    s = diagnose(paths).stragglers
    assert s.kind == "persistent" and sorted(s.ranks) == sc.ranks == [4, 5, 6, 7], s.reason
    tie = {n["rank"]: n["tie_cost"] for n in (s.whatif or {})["explaining_set"]}
    assert sorted(tie) == [4, 5, 6, 7] and min(tie.values()) >= 0.05
