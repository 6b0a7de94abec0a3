"""Issue 27's scenario types of the accuracy benchmark (rotating, masking, mixed, mixed3): they are
drawn apart from the existing ones, whose sequences stay exactly as they were, and each new type
injects what it claims (train_knobs ``mixed`` mode, ``cpu.new_scenarios``, ``gpu.new_scenarios``).

The fingerprints below were computed with the code before the new types were added (main at
ed5861e): the same seed must keep generating the same jobs, or earlier rounds' figures stop being
comparable.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

import numpy as np
import pytest

from benchmarks.diag_scenarios import cpu, gpu, train_knobs, truth

OLD_FINGERPRINTS = {
    "cpu27": "a559d18289791711",
    "cpu0": "cd0b3fd1d8a1ca5c",
    "gpu": "cbe197672aa91b37",
    "knobs": "f82929e74062d5cc",
}


def _h(rows: Any) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


def _cpu_rows(n: int, seed: int) -> list[Any]:
    return [
        [s.sid, s.type, s.world, s.mode, s.hit, s.ms, s.kind, s.extra, s.args()]
        for s in cpu.scenarios(n, seed=seed)
    ]


def _knob_rows() -> list[Any]:
    out = []
    for argv in (
        ["--mode", "sleep", "--ranks-hit", "1,3", "--ms", "30", "--seed", "5"],
        ["--mode", "intermittent", "--ms", "60", "--prob", "0.3", "--seed", "1004"],
        ["--mode", "compute", "--ranks-hit", "2", "--ms", "3"],
    ):
        a = train_knobs.parser().parse_args([*argv, "--progress-dir", "x"])
        hit = [int(x) for x in a.ranks_hit.split(",") if x]
        out.append(
            [[round(train_knobs.injected_ms(a, hit, s, r, 4), 9) for r in range(4)] for s in range(40)]
        )
    return out


def test_existing_sequences_are_unchanged() -> None:
    gpu_rows = [
        [
            s.sid,
            s.ranks,
            gpu.KIND[s.type],  # the plans and ranks; the kind follows stragglers.kinds (below)
            s.params,
            [round(float(x.sum()), 3) for x in (s.plan.delay, s.plan.stretch, s.plan.link)],
        ]
        for s in gpu.scenarios(2, ["nccl_parser", "sampled128"])
    ]
    got = {
        "cpu27": _h(_cpu_rows(24, 27)),
        "cpu0": _h(_cpu_rows(16, 0)),
        "gpu": _h(gpu_rows),
        "knobs": _h(_knob_rows()),
    }
    assert got == OLD_FINGERPRINTS
    # an intermittent job whose stalls move between ranks over steps is labelled rotating now
    kinds = {s.sid: s.kind for s in gpu.scenarios(2, ["nccl_parser", "sampled128"])}
    assert kinds["gpu-intermittent-nccl_parser-w4-s1"] == "rotating"
    assert kinds["gpu-intermittent-nccl_parser-w2-s0"] == "intermittent"
    assert not {s.type for s in cpu.scenarios(40, seed=3)} & set(cpu.NEW_CPU_TYPES)
    assert not {s.type for s in gpu.scenarios(1, ["nccl_parser"])} & set(gpu.NEW_TYPES)


def _knobs(*argv: str) -> Any:
    return train_knobs.parser().parse_args([*argv, "--progress-dir", "x"])


def test_mixed_spec_gives_each_rank_its_own_schedule() -> None:
    a = _knobs(
        "--mode", "mixed", "--spec", "1:sleep:30,2:sleep:30,3:intermittent:60:0.5,4:compute:20", "--seed", "9"
    )
    rows = [[train_knobs.injected_ms(a, [], s, r, 6) for r in range(6)] for s in range(400)]
    assert all(row[1] == row[2] == 30.0 for row in rows)  # masking: exactly equal every step
    assert all(row[4] == 20.0 and row[0] == row[5] == 0.0 for row in rows)
    stalls = [row[3] for row in rows]
    assert set(stalls) == {0.0, 60.0} and 0.4 < stalls.count(60.0) / len(stalls) < 0.6
    again = [[train_knobs.injected_ms(a, [], s, r, 6) for r in range(6)] for s in range(400)]
    assert again == rows  # a function of the seed and step: every rank computes the same
    assert [train_knobs.holds_busy(a, r) for r in range(6)] == [False, False, False, False, True, False]
    for bad in ("1:nap:30", "1:sleep", "x:sleep:3", "1:sleep:3,1:compute:3"):
        with pytest.raises(ValueError, match="--spec"):
            train_knobs.parse_spec(bad)


def test_rotating_jobs_stall_one_random_rank_per_step_for_most_of_it() -> None:
    jobs = cpu.new_scenarios(8, seed=27, only=["rotating"])
    assert [s.type for s in jobs] == ["rotating"] * 8
    for sc in jobs:
        a = _knobs(*sc.args())
        assert a.mode == "intermittent" and a.step_frac == cpu.ROTATING_STEP_FRACTION
        assert 0.2 <= a.prob <= 0.4
        rows = [
            [train_knobs.injected_ms(a, [], s, r, sc.world) for r in range(sc.world)] for s in range(2000)
        ]
        assert all(sum(v > 0 for v in row) <= 1 for row in rows)  # one rank per stalled step
        assert abs(sum(any(row) for row in rows) / len(rows) - a.prob) < 0.05
        assert len({row.index(max(row)) for row in rows if any(row)}) == sc.world  # random ranks
    # a step that holds nothing is measured all the same (the stall is 80 % of the recent step)
    sized = train_knobs.StepFraction(0.8, fallback_ms=60.0)
    for k in range(5):
        sized.ms(k * 0.050, hold=False)
    assert sized.ms(0.250, hold=True) == pytest.approx(0.8 * 50.0)


def test_new_cpu_jobs_are_what_their_type_says() -> None:
    jobs = cpu.new_scenarios(16, seed=27)
    assert [s.type for s in jobs[:4]] == list(cpu.NEW_CPU_TYPES)
    for sc in jobs:
        mode, kinds, ms, kind = cpu.NEW_CPU_TYPES[sc.type]
        assert sc.mode == mode and sc.kind == kind and sc.world >= len(kinds) + 2
        if sc.type == "rotating":
            continue
        spec = train_knobs.parse_spec(sc.extra["spec"])
        assert sorted(spec) == sc.hit and sorted(s.kind for s in spec.values()) == sorted(kinds)
        if sc.type == "masking":
            assert {s.ms for s in spec.values()} == {ms}
    assert len({s.sid for s in cpu.new_scenarios(40, seed=1)}) == 40
    assert cpu.new_scenarios(4, seed=27) == jobs[:4]
    assert cpu.new_scenarios(2, seed=27, worlds=[4])[1].world == 4
    with pytest.raises(ValueError, match="unknown new CPU scenario type"):
        cpu.new_scenarios(1, only=["persistent"])


def test_new_labels_come_from_who_stalled_in_the_traced_steps() -> None:
    mixed = next(s for s in cpu.new_scenarios(4, seed=27) if s.type == "mixed")
    kinds = {int(r): k for r, k in mixed.extra["kinds"].items()}
    p = next(r for r, k in kinds.items() if k == "sleep")
    i = next(r for r, k in kinds.items() if k == "intermittent")
    every = {s: {p: 30.0} for s in range(16)}
    assert cpu.new_label(mixed, every, 16) == ("persistent", [p])  # the intermittent rank never stalled
    two = every | {s: {p: 30.0, i: 60.0} for s in (2, 7)}
    assert cpu.new_label(mixed, two, 16) == ("persistent", [p])  # two stalls: noise to the verdict
    three = every | {s: {p: 30.0, i: 60.0} for s in (2, 7, 11)}
    assert cpu.new_label(mixed, three, 16) == ("mixed", sorted([p, i]))
    most = every | {s: {p: 30.0, i: 60.0} for s in range(9)}  # late in most steps: persistent
    assert cpu.new_label(mixed, most, 16) == ("persistent", sorted([p, i]))
    rot = cpu.new_scenarios(1, seed=27)[0]
    assert cpu.new_label(rot, {}, 16) == ("none", [])
    assert cpu.new_label(rot, {3: {1: 40.0}, 5: {1: 40.0}}, 16) == ("intermittent", [1])
    assert cpu.new_label(rot, {3: {1: 40.0}, 5: {2: 40.0}, 9: {1: 40.0}}, 16) == ("rotating", [1, 2])


def _steps_with_stall(sc: gpu.Scenario, base: gpu.Base, r: int) -> set[int]:
    return {int(base.step_of[i]) for i in np.where(sc.plan.delay[r] > 0)[0]}


def test_new_gpu_plans_inject_what_their_type_says() -> None:
    base = gpu.load_base("trace_diff")
    scs = gpu.new_scenarios(4, ["trace_diff", "nccl_parser"])
    assert [s.type for s in scs[:4]] == list(gpu.NEW_TYPES)
    for sc in scs:
        assert sc.world >= gpu.N_STRAGGLERS[sc.type] + 2
        assert sc.kind == gpu.NEW_KIND[sc.type] or (sc.type.startswith("mixed") and sc.kind == "persistent")
        if sc.type in gpu.STEPPED:
            assert sc.base == "trace_diff"
        d = sc.plan.delay
        if sc.type == "rotating":
            per_step = [
                {r for r in range(sc.world) if _steps_with_stall(sc, base, r) & {s}} for s in range(6)
            ]
            assert all(len(who) <= 1 for who in per_step)  # one rank per stalled step
            assert sum(map(len, per_step)) >= gpu.MIN_STALLS and len(sc.ranks) >= 2
            assert sorted(set().union(*per_step)) == sc.ranks
            assert d[d > 0].min() >= 0.5 * base.step_us and 0.2 <= sc.params["prob"] <= 0.4
        elif sc.type == "masking":
            r1, r2 = sc.ranks
            assert np.array_equal(d[r1], d[r2]) and d[r1].min() > 0
            assert not np.delete(d, [r1, r2], axis=0).any()
        else:
            p, (i, _stalls) = sc.params["persistent"], sc.params["intermittent"]
            lb = gpu.load_base(sc.base)
            assert _steps_with_stall(sc, lb, p) == set(range(lb.n_steps))
            late = len(_steps_with_stall(sc, lb, i))
            assert late >= gpu.MIN_STALLS
            assert sc.kind == ("mixed" if 2 * late <= lb.n_steps else "persistent")
            assert (sc.type == "mixed3") == bool(sc.plan.stretch.any())
            assert sorted([p, i, *([sc.params["compute"]] if sc.type == "mixed3" else [])]) == sc.ranks
    with pytest.raises(ValueError, match="no base with"):
        gpu.new_scenarios(1, ["nccl_parser"], ["rotating"])


def _agrees(stype: str, base: str, world: int, tmp_path) -> None:
    sc = gpu.new_scenarios(1, [base], [stype], [world])[0]
    paths = gpu.write_job(gpu.load_base(sc.base), sc.plan, random.Random(0), tmp_path)
    gt = truth.ground_truth(paths)
    assert gpu.truth_agrees(sc, gt), (sc.sid, gt.imposed_us)


def test_masking_gpu_job_agrees_with_the_arrival_order_truth(tmp_path) -> None:
    """The written files, read by the standard-library truth: the equal pair is the latest set."""
    _agrees("masking", "nccl_parser", 4, tmp_path)


@pytest.mark.slow  # 25-40 s each on a loaded 2-core box: the 6-step base is 1.7 MB of trace per rank
@pytest.mark.parametrize("stype", ["rotating", "mixed", "mixed3"])
def test_stepped_gpu_jobs_agree_with_the_arrival_order_truth(stype: str, tmp_path) -> None:
    """The written files, read by the standard-library truth, charge the labelled ranks."""
    _agrees(stype, "trace_diff", 5 if stype == "mixed3" else 4, tmp_path)
