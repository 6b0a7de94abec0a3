"""The demo's stratified intermittent straggler: every aligned window of B steps holds the same
number of stalls (a random schedule left 1-2 stalls in some traced windows, too few to call a
pattern; docs/demo.md)."""

from __future__ import annotations

from kinetoscope.demo.driver import DemoOptions
from kinetoscope.demo.train_ddp import StragglerPlan, build_parser


def _stalls(plan: StragglerPlan, steps: range, rank: int = 1) -> list[int]:
    return [s for s in steps if plan.sleep_ms(s, rank, 2) > 0]


def test_every_block_of_ten_steps_holds_three_stalls_on_the_straggler_only():
    plan = StragglerPlan(mode="intermittent", rank=1, prob=0.3, lo_ms=250, hi_ms=400, seed=0, block=10)
    for start in range(0, 500, 10):  # kscope demo traces steps S+1 .. S+10, S a multiple of 10
        window = range(start + 1, start + 11)
        assert len(_stalls(plan, window)) == 3
        assert _stalls(plan, window, rank=0) == []
    assert all(250 <= plan.sleep_ms(s, 1, 2) <= 400 for s in _stalls(plan, range(1, 200)))


def test_block_zero_keeps_the_independent_per_step_schedule():
    random_plan = StragglerPlan(mode="intermittent", rank=1, prob=0.3, lo_ms=50, hi_ms=200, seed=0)
    counts = {len(_stalls(random_plan, range(s + 1, s + 11))) for s in range(0, 500, 10)}
    assert len(counts) > 1  # not stratified: windows differ
    assert build_parser().parse_args([]).straggler_block == 0


def test_the_demo_uses_the_stratified_schedule_with_stalls_far_beyond_loaded_host_noise():
    o = DemoOptions()
    assert o.straggler == "intermittent" and o.straggler_block == 10 and round(o.straggler_prob * 10) == 3
    assert o.straggler_ms[0] >= 250.0  # 8 sigma of the noisiest demo host measured: 216 ms
