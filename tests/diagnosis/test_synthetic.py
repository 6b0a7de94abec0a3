"""Diagnosis on synthetic jobs whose answer is known by construction (diag_synth)."""

from __future__ import annotations

import random

import numpy as np
import polars as pl
import pytest
from diag_synth import MS, make_job
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kinetoscope.diagnosis import StragglerThresholds, diagnose
from kinetoscope.diagnosis.assembly import assemble_jobs
from kinetoscope.diagnosis.clock import align_clocks
from kinetoscope.diagnosis.collectives import extract_collectives, normalize_collective
from kinetoscope.diagnosis.stragglers.kinds import job_kind


def _jitter(world: int, steps: int, n_coll: int = 2, sd_ns: int = 200_000, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(0, sd_ns, size=(world, steps, n_coll)).astype(int).tolist()


# ---- stragglers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", ["gloo", "nccl"])
def test_persistent_rank_2_late_30ms_at_every_collective(flavour):
    world, steps = 4, 12
    late = [[30.0 if r == 2 else 0.0] * steps for r in range(world)]
    d = diagnose(make_job(world, steps, late_ms=late, jitter_ns=_jitter(world, steps), flavour=flavour))
    s = d.stragglers
    assert s.kind == "persistent"
    assert s.ranks == [2]
    assert s.hosts == {2: "host2"}
    row = s.per_rank.filter(pl.col("rank") == 2).row(0, named=True)
    # the first optimizer-delimited step starts where the trace starts; here it holds the whole
    # step (every collective on every rank), as on-demand iteration traces do: it is analysed
    assert s.steps_analysed == steps
    assert row["late_steps"] == steps and row["late_share"] == 1.0
    assert row["mean_lateness(us)"] == pytest.approx(30_000, rel=0.05)
    # what-if: each 100 ms step loses the 30 ms the others waited
    assert s.lost_fraction == pytest.approx(0.30, abs=0.03)
    assert s.est_step_time_us == pytest.approx(s.mean_step_time_us - 30_000, rel=0.05)
    # DDP-like: wall step times are equal on every rank, only arrivals tell the straggler
    times = d.steps.group_by("step").agg(pl.col("step_time(us)").max() - pl.col("step_time(us)").min())
    assert float(times["step_time(us)"].max()) < 2_000
    assert d.to_dict()["stragglers"]["kind"] == "persistent"
    assert d.summary()[0].startswith("PERSISTENT STRAGGLER: rank 2 (host host2)")
    rec = [r for r in d.recommendations if r["id"] == "straggler-persistent"]
    assert rec and rec[0]["severity"] == "high" and rec[0]["evidence"]["ranks"] == [2]


def test_random_ranks_late_in_20_percent_of_steps_are_rotating():
    world, steps = 8, 40
    rng = random.Random(7)
    late = [[0.0] * steps for _ in range(world)]
    truth = {}
    for s in range(steps):
        if rng.random() < 0.2:
            v = rng.randrange(world)
            late[v][s] = 60.0
            truth[s] = v
    assert len(truth) >= 4 and len(set(truth.values())) >= 3
    d = diagnose(make_job(world, steps, late_ms=late, jitter_ns=_jitter(world, steps, seed=1)))
    s = d.stragglers
    stalls: dict[int, list[int]] = {}
    for st_, v in truth.items():
        stalls.setdefault(v, []).append(st_)
    assert s.kind == job_kind(stalls, steps) == "rotating"  # one random rank per stalled step
    found = {
        st_: lr
        for st_, lr in zip(s.per_step["step"].to_list(), s.per_step["late_ranks"].to_list(), strict=True)
        if lr
    }
    assert found == {k: [v] for k, v in truth.items()}
    assert set(s.ranks) == set(truth.values())
    rec = [r for r in d.recommendations if r["id"] == "straggler-intermittent"]
    assert rec and "hierarchical SGD" in rec[0]["action"] and "10 %" in rec[0]["action"]


def test_clean_job_says_none():
    world, steps = 4, 20
    d = diagnose(make_job(world, steps, jitter_ns=_jitter(world, steps, sd_ns=500_000, seed=3)))
    assert d.stragglers.kind == "none"
    assert d.summary()[0].startswith("NO STRAGGLER")
    assert not [r for r in d.recommendations if r["id"].startswith("straggler")]


def test_a_rank_last_every_time_by_too_little_is_none_and_the_reason_says_so():
    # rank 5 of 8 is 0.3 ms late at every collective of 100 ms steps: last at all 32 (chance
    # 1/8), imposing 0.3 % of step time, under the 1 % a named rank must impose. The reason
    # said "no rank is last far more often than chance" beside a table showing 32/32
    world, steps = 8, 16
    late = [[0.3 if r == 5 else 0.0] * steps for r in range(world)]
    s = diagnose(
        make_job(world, steps, late_ms=late, jitter_ns=_jitter(world, steps, sd_ns=20_000, seed=3))
    ).stragglers
    assert s.kind == "none" and s.ranks == []
    assert s.reason.startswith("rank 5 is last far more often than chance (at 32/32 collectives, chance 12%")
    imposed = float(s.per_rank.filter(pl.col("rank") == 5)["imposed_wait(us)"][0])
    share = imposed / (s.mean_step_time_us * steps)  # what the table shows, as a share of step time
    assert 0.002 < share < 0.01 and f"the wait it imposes, {100 * share:.1f}% of step time" in s.reason


def test_single_isolated_late_arrival_is_not_a_pattern():
    world, steps = 4, 20
    late = [[0.0] * steps for _ in range(world)]
    late[1][7] = 50.0
    d = diagnose(make_job(world, steps, late_ms=late, jitter_ns=_jitter(world, steps)))
    assert d.stragglers.kind == "none"
    assert "isolated" in d.stragglers.reason


def test_rare_straggler_below_min_lost_fraction_is_none():
    # 28 ms late in 2 of 40 steps of 100 ms: two events, but 1.4 % of the time lost (< 1.5 %; the
    # floor was 5 % and 60 ms stalls, lowered so that a small persistent delay, which saves
    # less than its size under jitter, is reported)
    world, steps = 4, 40
    late = [[0.0] * steps for _ in range(world)]
    for s in (9, 30):
        late[3][s] = 28.0
    d = diagnose(make_job(world, steps, late_ms=late))
    assert d.stragglers.straggled_steps == 2
    assert d.stragglers.kind == "none" and "only" in d.stragglers.reason


@pytest.mark.parametrize(("stall_ms", "kind"), [(40.0, "none"), (70.0, "intermittent")])
def test_occasional_stalls_need_five_percent_of_the_time(stall_ms, kind):
    # rank 3 stalls in 2 of 20 steps of 100 ms: 40 ms each is 4 % of the time (a loaded host
    # descheduling a rank now and then: kind none, the stalls in the reason), 70 ms is 7 %
    world, steps = 4, 20
    late = [[0.0] * steps for _ in range(world)]
    for s in (6, 14):
        late[3][s] = stall_ms
    s = diagnose(make_job(world, steps, late_ms=late, jitter_ns=_jitter(world, steps))).stragglers
    assert s.kind == kind
    if kind == "none":
        assert (
            s.ranks == []
            and "[3] were late in 2/20 steps, but none is persistent, together costing 4" in s.reason
        )
        assert s.lost_fraction == pytest.approx(0.04, abs=0.005)
    else:
        assert s.ranks == [3] and s.lost_fraction == pytest.approx(0.07, abs=0.005)


@pytest.mark.parametrize(("every", "kind"), [(2, "none"), (1, "persistent")])
def test_two_ranks_preempted_together_in_half_the_steps_are_jitter(every, kind):
    # ranks 0 and 3 (two processes sharing a busy core) arrive 5 ms late together in every
    # `every`-th step of 40 ms, under the 6 ms event threshold: the two latest far more often
    # than chance at the instances, so the pair route names them; in half of the steps that is
    # what chance gives either of two ranks of four (7.5 % of the time: arrival jitter from the
    # host, kind none), in every step they are a persistent pair
    world, steps = 4, 16
    rng = np.random.default_rng(3)
    jit = rng.normal(0, 500_000, size=(world, steps, 2))
    for s in range(0, steps, every):
        for r in (0, 3):
            jit[r, s, :] += 5_000_000 + rng.normal(0, 300_000, size=2)
    s = diagnose(make_job(world, steps, period_ms=40.0, jitter_ns=jit.astype(int).tolist())).stragglers
    assert s.kind == kind
    if kind == "none":
        assert s.lost_fraction > 0.05 and "arrival jitter" in s.reason and "[0, 3]" in s.reason
    else:
        assert sorted(s.ranks) == [0, 3]


@pytest.mark.parametrize("flavour", ["gloo", "nccl"])
def test_two_of_three_ranks_late_together_is_a_persistent_pair(flavour):
    # ranks 1 and 2 of 3 both arrive ~30 ms late in every step, within a few ms of each other, so
    # each is the last one only about half the time: the typical (median) arrival is a late
    # rank's, and measured from it the pair would cost only the few ms between them (the
    # verdict said "arrival jitter" on such a real job). Fixed together they save what rank 0
    # waits: ~30 ms of an 80 ms step.
    world, steps = 3, 16
    rng = np.random.default_rng(7)
    jit = rng.normal(0, 300_000, size=(world, steps, 2))
    late = [[0.0] * steps] + [[30.0 + float(rng.normal(0, 2.0)) for _ in range(steps)] for _ in (1, 2)]
    job = make_job(
        world, steps, period_ms=80.0, late_ms=late, jitter_ns=jit.astype(int).tolist(), flavour=flavour
    )
    s = diagnose(job).stragglers
    assert s.kind == "persistent" and sorted(s.ranks) == [1, 2], s.reason
    assert s.lost_fraction == pytest.approx(30.0 / 80.0, abs=0.06)
    shares = {row["rank"]: row["lost_share"] for row in s.per_rank.iter_rows(named=True)}
    assert shares[1] == pytest.approx(0.5, abs=0.2) and shares[2] == pytest.approx(0.5, abs=0.2)


@pytest.mark.parametrize("flavour", ["gloo", "nccl"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_half_the_ranks_late_together_on_one_host_are_named_as_a_group(flavour, seed):
    # a two-node job whose second node is slow: ranks 4-7 (host b) arrive 30 ms late together in
    # every 80 ms step, within 0.3 ms of each other. None of them is last more often than its
    # peers and each alone imposes only that jitter: the single and pair routes named nothing
    # ('none' in every seed), though the job waits 30 ms a step for them.
    world, steps = 8, 16
    late = [[30.0 if r >= 4 else 0.0] * steps for r in range(world)]
    hosts = ["a"] * 4 + ["b"] * 4
    job = make_job(
        world,
        steps,
        period_ms=80.0,
        late_ms=late,
        hosts=hosts,
        jitter_ns=_jitter(world, steps, sd_ns=300_000, seed=seed),
        flavour=flavour,
    )
    d = diagnose(job)
    s = d.stragglers
    assert s.kind == "persistent" and sorted(s.ranks) == [4, 5, 6, 7], s.reason
    assert s.lost_fraction == pytest.approx(30.0 / 80.0, abs=0.05)
    (group,) = s.groups
    assert group["ranks"] == [4, 5, 6, 7] and group["latest_together"] >= 0.9 * group["instances"]
    assert group["chance"] == pytest.approx(1 / 70) and group["p_value"] < 1e-6
    shares = {row["rank"]: row["lost_share"] for row in s.per_rank.iter_rows(named=True)}
    assert all(shares[r] == pytest.approx(0.25, abs=0.05) for r in (4, 5, 6, 7))  # theirs together
    assert all(s.hosts[r] == "b" for r in s.ranks)
    assert "ranks 4, 5, 6, 7 the 4 latest together" in s.reason
    rec = next(r for r in d.recommendations if r["id"] == "straggler-persistent")
    assert "arrive late together" in rec["action"] or "arrive late together" in rec["title"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_of_three_late_in_lockstep_are_named(seed):
    # the lockstep twin of the two-of-three test above: both sleep exactly 30 ms, so they swap
    # the last place at random and neither is last more often than chance ('none' before)
    world, steps = 3, 16
    late = [[0.0] * steps, [30.0] * steps, [30.0] * steps]
    job = make_job(
        world, steps, period_ms=80.0, late_ms=late, jitter_ns=_jitter(world, steps, sd_ns=300_000, seed=seed)
    )
    s = diagnose(job).stragglers
    assert s.kind == "persistent" and sorted(s.ranks) == [1, 2], s.reason
    assert s.lost_fraction == pytest.approx(30.0 / 80.0, abs=0.05)
    assert [g["ranks"] for g in s.groups] == [[1, 2]]


@pytest.mark.parametrize("seed", [1, 2, 6, 7])
def test_a_pair_late_together_with_one_step_apart_is_steady(seed):
    # ranks 2 and 3 of 4 are 25 ms late together at every collective (a slow node's pair); in one
    # step rank 2 is 1.5 ms later than rank 3. Each alone imposes only its margin over the other,
    # so that step read as a spike of the pair's cost and the pair as "steady skew with spikes"
    # (intermittent), though it costs 28 % of every step; what fixing both saves is steady
    world, steps = 4, 8
    rng = np.random.default_rng(seed)
    jit = rng.normal(0, 100_000, size=(world, steps, 2))
    jit[2:] += 25_000_000
    jit[2, 0, 0] += 1_500_000
    s = diagnose(make_job(world, steps, jitter_ns=jit.astype(int).tolist(), flavour="nccl")).stragglers
    assert s.kind == "persistent" and sorted(s.ranks) == [2, 3] and s.pattern == "steady", s.reason
    assert s.lost_fraction == pytest.approx(0.28, abs=0.02)


@pytest.mark.parametrize("world", [4, 6, 8])
def test_one_early_rank_does_not_make_the_others_a_group(world):
    # the others 30 ms "late" together is one rank 30 ms early: most of the ranks are never a
    # group (its complement, a few early ranks, is no straggler)
    steps = 16
    late = [[0.0 if r == 1 else 30.0] * steps for r in range(world)]
    job = make_job(world, steps, period_ms=80.0, late_ms=late, jitter_ns=_jitter(world, steps, sd_ns=300_000))
    s = diagnose(job).stragglers
    assert s.kind == "none" and s.groups == [], s.reason


def test_small_persistent_lateness_is_still_persistent():
    # 8 ms (8 % of a step) in every step: far below the intermittent threshold, but steady
    world, steps = 4, 12
    late = [[8.0 if r == 1 else 0.0] * steps for r in range(world)]
    d = diagnose(make_job(world, steps, late_ms=late, jitter_ns=_jitter(world, steps, sd_ns=100_000)))
    assert d.stragglers.kind == "persistent" and d.stragglers.ranks == [1]


def test_first_step_left_out_when_a_rank_lacks_its_collectives():
    # rank 1's trace misses step 0's first collective (its trace started inside that step)
    world, steps = 4, 10
    late = [[30.0 if r == 2 else 0.0] * steps for r in range(world)]
    d = diagnose(make_job(world, steps, late_ms=late, drop={(1, 0, 0)}, jitter_ns=_jitter(world, steps)))
    s = d.stragglers
    assert s.steps_analysed == steps - 1 and 0 not in s.per_step["step"].to_list()
    assert s.kind == "persistent" and s.ranks == [2]
    assert 0 in d.steps["step"].to_list()  # still in the per-step table


def test_first_step_is_judged_like_the_others():
    # a 20 ms stall in the first traced step (of 100 ms steps) and one later: both found, with
    # the same threshold (the first-step factor is retired: docs/diagnosis.md, "Rules that remain")
    world, steps = 4, 12
    late = [[0.0] * steps for _ in range(world)]
    late[1][0] = late[3][6] = 20.0
    s = diagnose(make_job(world, steps, late_ms=late, jitter_ns=_jitter(world, steps))).stragglers
    found = {
        st: lr
        for st, lr in zip(s.per_step["step"].to_list(), s.per_step["late_ranks"].to_list(), strict=True)
        if lr
    }
    assert found == {0: [1], 6: [3]}
    th = dict(zip(s.per_step["step"].to_list(), s.per_step["threshold(us)"].to_list(), strict=True))
    assert th[0] == pytest.approx(th[6]) and th[0] < 20_000
    assert s.to_dict()["thresholds"]["first_step_factor"] == 1.0  # the contract keeps the key


def test_small_intermittent_lateness_on_short_steps():
    # 12 ms late arrivals on 35 ms steps (34 % of a step), in ~25 % of 20 steps: all found;
    # the threshold is 25 % of the clean step (8.75 ms) here, the noise being far below (the
    # first step, with its doubled threshold, has none)
    world, steps = 4, 20
    rng = random.Random(3)
    late = [[0.0] * steps for _ in range(world)]
    truth = {}
    for s_ in range(1, steps):
        if rng.random() < 0.25:
            v = rng.randrange(world)
            late[v][s_] = 12.0
            truth[s_] = [v]
    assert len(truth) >= 3
    job = make_job(
        world, steps, late_ms=late, period_ms=35.0, compute_ms=[10.0] * world, jitter_ns=_jitter(world, steps)
    )
    s = diagnose(job).stragglers
    found = {
        st: lr
        for st, lr in zip(s.per_step["step"].to_list(), s.per_step["late_ranks"].to_list(), strict=True)
        if lr
    }
    stalls: dict[int, list[int]] = {}
    for st_, (v,) in truth.items():
        stalls.setdefault(v, []).append(st_)
    assert found == truth and s.kind == job_kind(stalls, steps)  # random ranks: rotating when they move
    clean = make_job(
        world,
        steps,
        period_ms=35.0,
        compute_ms=[10.0] * world,
        jitter_ns=_jitter(world, steps, sd_ns=500_000),
    )
    assert diagnose(clean).stragglers.kind == "none"


def test_two_ranks_noise_and_frequent_intermittent_straggler():
    # two ranks: the earlier rank's lateness is always 0; the noise must still be measured
    world, steps = 2, 10
    jit = _jitter(world, steps, sd_ns=3 * MS, seed=4)
    s = diagnose(make_job(world, steps, period_ms=30.0, compute_ms=[10.0] * world, jitter_ns=jit)).stragglers
    assert s.kind == "none" and s.sigma_us > 1000
    # rank 1 stalls 80 ms in 4 of 10 steps: every stall found (noise measured without them)
    late = [[0.0] * steps, [80.0 if st in (0, 1, 4, 8) else 0.0 for st in range(steps)]]
    d = diagnose(
        make_job(world, steps, late_ms=late, period_ms=120.0, compute_ms=[10.0] * world, jitter_ns=jit)
    )
    s = d.stragglers
    found = {
        st
        for st, lr in zip(s.per_step["step"].to_list(), s.per_step["late_ranks"].to_list(), strict=True)
        if lr
    }
    assert found == {0, 1, 4, 8} and s.kind == "intermittent" and s.ranks == [1]
    # one late rank: the recommendation names it rather than "different ranks"
    rec = next(r for r in d.recommendations if r["id"] == "straggler-intermittent")
    assert rec["title"] == "Intermittent straggler: rank 1 arrives late in some steps"
    assert "too frequent" in rec["action"]  # one of two ranks late: every subgroup would wait


def test_one_rank_late_in_a_few_steps_is_named():
    world, steps = 4, 12
    late = [[0.0] * steps for _ in range(world)]
    for step in (2, 6, 9):
        late[2][step] = 60.0
    d = diagnose(make_job(world, steps, late_ms=late, jitter_ns=_jitter(world, steps, seed=5)))
    assert d.stragglers.kind == "intermittent" and d.stragglers.ranks == [2]
    rec = next(r for r in d.recommendations if r["id"] == "straggler-intermittent")
    assert rec["title"] == "Intermittent straggler: rank 2 arrives late in some steps"
    assert rec["action"].startswith("Only rank 2 was late") and "hierarchical SGD" in rec["action"]


@pytest.mark.parametrize(
    ("straggled", "kind"), [(range(12), "persistent"), ((1, 2, 3, 5, 6, 8, 10, 11), "intermittent")]
)
def test_two_ranks_one_late_in_most_steps_by_varying_amounts(straggled, kind):
    # the demo's persistent mode (rank 1 sleeps U(50, 200) ms every step), and an intermittent
    # one that hit 8 of 12 steps: both ranks' skews vary with the delay, sigma follows
    # (tens of ms); the rank is found all the same. The second used to be expected
    # "persistent"; with two ranks one of them is the late one in 6 of 12 steps by chance, and
    # 8 of 12 is not far more than that (binomial p = 0.19): it is what it was injected as.
    world, steps = 2, 12
    rng = np.random.default_rng(2)
    late = [[0.0] * steps, [float(rng.uniform(50, 200)) if st in straggled else 0.0 for st in range(steps)]]
    jit = _jitter(world, steps, sd_ns=2 * MS, seed=5)
    period = [30.0 + late[1][st] for st in range(steps)]  # each step stretched by its delay
    s = diagnose(
        make_job(world, steps, late_ms=late, period_ms=period, compute_ms=[20.0] * world, jitter_ns=jit)
    ).stragglers
    assert s.sigma_us > 10_000  # the noise estimate is inflated ...
    assert s.kind == kind and s.ranks == [1]  # ... and the straggler found all the same
    row = s.per_rank.filter(pl.col("rank") == 1).row(0, named=True)
    assert row["late_steps"] == len(straggled)


def test_thresholds_are_configurable():
    # (the absolute floor no longer hides a rank that is last every time: the frequency route
    # names it; what a verdict must save is the knob for "not worth reporting")
    world, steps = 4, 12
    late = [[30.0 if r == 1 else 0.0] * steps for r in range(world)]
    assert diagnose(make_job(world, steps, late_ms=late)).stragglers.kind == "persistent"
    d = diagnose(make_job(world, steps, late_ms=late), thresholds=StragglerThresholds(min_lost_fraction=0.5))
    assert d.stragglers.kind == "none" and "save only" in d.stragglers.reason


# ---- clock alignment ---------------------------------------------------------------------------------


def _align(traces):
    job = assemble_jobs(traces)[0]
    colls = {r: extract_collectives(t) for r, t in job.traces.items()}
    return align_clocks(colls, job.hosts())


def test_clock_offsets_recovered_exactly():
    offsets = [0, 5 * MS, -3_200_000, 250_000]
    traces = make_job(4, 8, offsets_ns=offsets)
    clock = _align(traces)
    assert clock.reference == 0
    assert clock.offsets == dict(enumerate(offsets))
    t = clock.table
    assert t["method"].to_list() == ["reference", "collectives", "collectives", "collectives"]
    assert t["residual_us"].to_list() == [0.0, 0.0, 0.0, 0.0]
    # causality bounds hold the true offset
    for row in t.filter(pl.col("method") == "collectives").iter_rows(named=True):
        assert row["lower_bound_us"] <= row["offset_us"] <= row["upper_bound_us"]


def test_clock_alignment_robust_to_missing_collective_and_shifted_window():
    offsets = [0, 40 * MS, -70 * MS, 3 * MS]
    late = [[0.0] * 10 for _ in range(4)]
    late[2] = [25.0] * 10  # a persistent straggler on top
    traces = make_job(
        4,
        10,
        offsets_ns=offsets,
        late_ms=late,
        drop={(1, 4, 0), (3, 6, 1)},  # a collective missing on ranks 1 and 3
        skip_steps={3: {0, 1}},  # rank 3's trace starts two steps later
    )
    d = diagnose(traces)
    assert d.clock.offsets == dict(enumerate(offsets))
    # rank 3's steps carry the job-wide labels 2..9
    assert sorted(d.steps.filter(pl.col("rank") == 3)["step"].to_list()) == list(range(2, 10))
    assert d.stragglers.kind == "persistent" and d.stragglers.ranks == [2]


def test_same_host_ranks_share_a_clock():
    traces = make_job(
        4,
        6,
        hosts=["a", "a", "b", "b"],
        offsets_ns=[0, 0, 7 * MS, 7 * MS],
        jitter_ns=_jitter(4, 6, sd_ns=100_000),
    )
    clock = _align(traces)
    methods = dict(zip(clock.table["rank"].to_list(), clock.table["method"].to_list(), strict=True))
    assert methods == {0: "reference", 1: "same_host", 2: "host_median", 3: "host_median"}
    assert clock.offsets[1] == 0
    assert abs(clock.offsets[2] - 7 * MS) < 300_000 and clock.offsets[2] == clock.offsets[3]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("same_host", [True, False])
def test_persistent_straggler_with_crossing_gloo_end_times(seed, same_host):
    # Real 4-rank gloo run: rank 2 late 150 ms of ~200 ms steps, two buckets per step whose
    # recorded ends cross by ms. A few crossed pairs used to make the correct offset lose to a
    # one-step shift (rank 2 then looked early, and the verdict was "none").
    rng = np.random.default_rng(seed)
    world, steps = int(rng.integers(2, 6)), 12
    late_rank, late = int(rng.integers(0, world)), float(rng.uniform(20, 170))
    lm = [[late if r == late_rank else 0.0] * steps for r in range(world)]
    ends = rng.uniform(0, 6 * MS, size=(world, steps, 2)).astype(int).tolist()
    offs = [0] * world if same_host else [0, *(int(x) for x in rng.integers(-5 * MS, 5 * MS, size=world - 1))]
    d = diagnose(
        make_job(
            world,
            steps,
            late_ms=lm,
            period_ms=200.0,
            transfer_ms=1.0,
            jitter_ns=_jitter(world, steps, sd_ns=300_000, seed=seed),
            end_jitter_ns=ends,
            offsets_ns=offs,
            hosts=["a"] * world if same_host else None,
        )
    )
    assert d.stragglers.kind == "persistent" and d.stragglers.ranks == [late_rank]
    assert all(abs(d.clock.offsets[r] - offs[r]) < 10 * MS for r in range(world))


def test_nccl_seq_matching():
    traces = make_job(3, 5, offsets_ns=[0, 2 * MS, -MS], flavour="nccl")
    for t in traces:
        t.events = t.events.with_columns(
            pl.when(pl.col("kind") == "kernel")
            .then(pl.col("ts").rank("ordinal").over("stream").cast(pl.Int64))
            .alias("seq")
        ).with_columns(pl.when(pl.col("stream") == 20).then(pl.col("seq")).alias("seq"))
    clock = _align(traces)
    assert clock.match_method == "seq"
    assert clock.offsets == {0: 0, 1: 2 * MS, 2: -MS}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    offsets=st.lists(st.integers(min_value=-2_000_000_000, max_value=2_000_000_000), min_size=3, max_size=3),
    late_rank=st.integers(min_value=0, max_value=3),
    late=st.floats(min_value=10.0, max_value=60.0),
)
def test_property_offsets_exact_and_persistent_straggler_found(offsets, late_rank, late):
    offs = [0, *offsets]
    lm = [[late if r == late_rank else 0.0] * 8 for r in range(4)]
    d = diagnose(make_job(4, 8, offsets_ns=offs, late_ms=lm))
    assert d.clock.offsets == dict(enumerate(offs))
    assert d.stragglers.kind == "persistent"
    assert d.stragglers.ranks == [late_rank]


# ---- per-rank, per-step attribution ------------------------------------------------------------------


def test_breakdown_sync_wait_transfer_and_self_time():
    world, steps = 4, 6
    late = [[30.0 if r == 2 else 0.0] * steps for r in range(world)]
    d = diagnose(make_job(world, steps, late_ms=late, n_coll=1, transfer_ms=2.0))
    bd = d.steps
    r0 = bd.filter(pl.col("rank") == 0)
    r2 = bd.filter(pl.col("rank") == 2)
    # rank 0 waits 30 ms for rank 2 inside the collective, then 2 ms of transfer
    assert r0["sync_wait(us)"].to_list() == pytest.approx([30_000] * steps, abs=1)
    assert r0["transfer(us)"].to_list() == pytest.approx([2_000] * steps, abs=1)
    assert r2["sync_wait(us)"].to_list() == pytest.approx([0] * steps, abs=1)
    assert r2["lateness(us)"].to_list() == pytest.approx([30_000] * steps, abs=1)
    # self time exposes the straggler although wall step times are equal
    assert float(r2["self_time(us)"].mean()) - float(r0["self_time(us)"].mean()) == pytest.approx(
        30_000, rel=0.02
    )
    assert float(r0["compute(us)"].mean()) == pytest.approx(19_800, rel=0.01)
    assert set(bd.columns) >= {
        "rank",
        "step",
        "step_time(us)",
        "compute(us)",
        "comm(us)",
        "exposed_comm(us)",
        "sync_wait(us)",
        "transfer(us)",
        "launch_gap(us)",
        "dataloader(us)",
        "idle(us)",
    }


def test_gpu_breakdown_compute_comm_and_launch_gap():
    d = diagnose(make_job(2, 4, flavour="nccl", device_name="NVIDIA H100 80GB HBM3"))
    bd = d.steps
    assert bd["n_kernels"].min() == 6  # 4 gemm + 2 nccl per step
    assert float(bd["compute(us)"].mean()) == pytest.approx(19_920, rel=0.01)
    assert float(bd["comm(us)"].mean()) > 0
    assert bd["launch_gap(us)"].null_count() == 0
    assert d.mfu.device_key == "H100 SXM" and d.mfu.precision == "bf16"


def test_dataloader_time_is_attributed():
    extra = {
        r: [
            {
                **dict.fromkeys(["idx"]),
                "kind": "user_annotation",
                "cat": "user_annotation",
                "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                "pid": 1,
                "tid": 1,
                "ts": 1_700_000_000 * 1_000_000_000 + s * 100 * MS + 50_000,
                "dur": 15 * MS,
            }
            for s in range(6)
        ]
        for r in range(2)
    }
    d = diagnose(make_job(2, 6, extra_events=extra))
    assert d.steps["dataloader(us)"].to_list() == pytest.approx([15_000] * 12)
    rec = [r for r in d.recommendations if r["id"] == "dataloader-stall"]
    expect = float(d.steps["dataloader(us)"].sum()) / float(d.steps["step_time(us)"].sum())
    assert rec and rec[0]["evidence"]["dataloader_fraction"] == pytest.approx(expect, abs=0.001)
    assert "num_workers" in rec[0]["action"] and "pin_memory" in rec[0]["action"]


def test_gloo_arrival_is_the_issue_time():
    # make_job's gloo ranks issue c10d::allreduce_ 200 us before the worker picks the work up
    t = make_job(2, 3, n_coll=1)[0]
    c = extract_collectives(t)
    ann = t.events.filter(pl.col("name") == "gloo:all_reduce").sort("ts")
    ops = t.events.filter(pl.col("name") == "c10d::allreduce_").sort("ts")
    assert c["arrival"].to_list() == ops["ts"].to_list()
    assert c["end"].to_list() == (ann["ts"] + ann["dur"]).to_list()
    # an annotation whose issue op is outside the trace keeps its own start
    t.events = t.events.filter(~((pl.col("name") == "c10d::allreduce_") & (pl.col("ts") == ops["ts"][0])))
    c = extract_collectives(t)
    assert c["arrival"].to_list() == [ann["ts"][0], *ops["ts"].to_list()[1:]]
    # no issue ops at all: annotation starts
    t.events = t.events.filter(pl.col("name") != "c10d::allreduce_")
    assert extract_collectives(t)["arrival"].to_list() == ann["ts"].to_list()


# ---- names ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "coll"),
    [
        ("c10d::allreduce_", "allreduce"),
        ("gloo:all_reduce", "allreduce"),
        ("nccl:_all_gather_base", "allgather"),
        ("c10d::_allgather_base_", "allgather"),
        ("nccl:all_to_all", "alltoall"),
        ("c10d::alltoall_base_", "alltoall"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "allreduce"),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "sendrecv"),
        ("c10d::reduce_scatter_tensor_coalesced_", "reducescatter"),
        ("allgather_into_tensor_coalesced", "allgather"),
        ("broadcast", "broadcast"),
    ],
)
def test_normalize_collective(name, coll):
    assert normalize_collective(name) == coll
