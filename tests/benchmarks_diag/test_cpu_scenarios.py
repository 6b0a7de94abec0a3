"""The CPU jobs of the accuracy benchmark (benchmarks/diag_scenarios/cpu.py, train_knobs.py): the
step-sized sleep of the `small` type and picking scenarios by type without changing them."""

from __future__ import annotations

import pytest

from benchmarks.diag_scenarios import cpu
from benchmarks.diag_scenarios.train_knobs import StepFraction, parser


def test_step_fraction_is_a_share_of_the_step_without_the_sleep() -> None:
    sized = StepFraction(0.08, fallback_ms=3.0)
    # steps start every 50 ms, then every 60 ms; each period held the previous step's sleep
    starts = [0.0, 0.050, 0.100, 0.150, 0.210, 0.270, 0.330]
    slept = [sized.ms(t) for t in starts]
    assert slept[:3] == [3.0, 3.0, 3.0]  # fewer than 3 periods known: the fixed fallback
    # periods 50, 50 ms held 3 ms sleeps: bases 47, 47 (and 47 for the third): 8 % of 47
    assert slept[3] == pytest.approx(0.08 * 47.0)
    # then 60 ms periods less the 3.76 ms slept: the median of [47, 47, 47, 56.24] is 47 (upper median)
    assert slept[4] == pytest.approx(0.08 * 47.0)
    base_5 = sorted([47.0, 47.0, 47.0, 60.0 - 0.08 * 47.0, 60.0 - 0.08 * 47.0])[2]
    assert slept[5] == pytest.approx(0.08 * base_5)


def test_step_fraction_window_forgets_old_steps() -> None:
    sized = StepFraction(0.1, fallback_ms=0.0, window=3)
    t = 0.0
    for _ in range(6):  # 100 ms periods, no sleep yet held (fallback 0)
        sized.ms(t)
        t += 0.100
    for _ in range(4):  # then 20 ms periods: the window holds only these
        sized.ms(t)
        t += 0.020
    assert len(sized.bases) == 3
    assert sized.ms(t) < 0.1 * 20.0  # 20 ms less the ~2 ms slept


def test_small_scenarios_pass_the_step_fraction() -> None:
    small = cpu.scenarios(2, seed=8, only=["small"])
    assert [s.type for s in small] == ["small", "small"]
    args = parser().parse_args([*small[0].args(), "--progress-dir", "x"])
    assert args.step_frac == cpu.STEP_FRACTION["small"] and args.mode == "compute"
    others = [s for s in cpu.scenarios(16, seed=8) if s.type != "small"]
    assert all("--step-frac" not in s.args() for s in others)


def test_small_mode_changes_only_how_small_jobs_hold_their_delay() -> None:
    busy = cpu.scenarios(16, seed=8)
    asleep = cpu.scenarios(16, seed=8, small_mode="sleep")
    assert [s.sid for s in busy] == [s.sid for s in asleep]  # the same jobs, by name
    for b, s in zip(busy, asleep, strict=True):
        assert s.mode == ("sleep" if b.type == "small" else b.mode)
        assert (b.world, b.hit, b.extra) == (s.world, s.hit, s.extra)
    with pytest.raises(ValueError, match="unknown small mode"):
        cpu.scenarios(1, small_mode="nap")


def test_picking_types_keeps_the_full_sequence_scenarios() -> None:
    full = {s.sid: s for s in cpu.scenarios(32, seed=5)}
    picked = cpu.scenarios(3, seed=5, only=["small", "clean"])
    assert [s.type for s in picked] == ["clean", "small", "clean"]
    for s in picked:
        assert s == full[s.sid]
    with pytest.raises(ValueError, match="unknown CPU scenario type"):
        cpu.scenarios(1, only=["nope"])
    assert cpu.scenarios(4, only=[]) == []
