"""The hierarchical-SGD plan (seed 000): the documented rule on measured topologies, and the
plan carried by the intermittent-straggler recommendation of a 2-host x 4-rank job."""

from __future__ import annotations

import random

import pytest
from diag_synth import make_job

from kinetoscope.diagnosis import diagnose
from kinetoscope.diagnosis.hsgd import WARMUP_STEPS, period_group_sizes, plan


@pytest.mark.parametrize(
    ("h", "hosts", "levels"),
    [
        (4, 2, [(2, 8)]),
        (2, 4, [(2, 4), (4, 8)]),
        (2, 8, [(2, 4), (4, 8), (8, 16)]),  # the post's 16 processes on 8 machines x 2 GPUs
        (8, 3, [(2, 16), (4, 24)]),  # 3 hosts: the top level is the whole world
    ],
)
def test_period_group_sizes_rule(h, hosts, levels):
    assert period_group_sizes(h, hosts) == levels


def _hosts(per_host: int, n: int) -> dict[int, str | None]:
    return {r: f"host{r // per_host}" for r in range(per_host * n)}


def test_plan_for_two_hosts_of_four():
    p = plan(_hosts(4, 2), lost_fraction=0.3, late_share=0.125, overlapped_comm_fraction=0.02)
    assert p["applies"] and p["period_group_size_dict"] == [[2, 8]] and p["warmup_steps"] == WARMUP_STEPS
    assert p["expected_gain_fraction_max"] == pytest.approx(0.3 * (1 - 4 / 8))
    assert p["expected_net_gain_fraction"] == pytest.approx(0.15 - 0.02)
    assert "OrderedDict([(2, 8)])" in p["code"] and "start_localSGD_iter=1000" in p["code"]


@pytest.mark.parametrize(
    ("hosts", "lost", "share", "why"),
    [
        ({r: "a" for r in range(8)}, 0.3, 0.1, "one host"),
        ({**_hosts(4, 2), 8: "host2"}, 0.3, 0.1, "different numbers"),
        ({r: f"host{r % 2}" for r in range(8)}, 0.3, 0.1, "not consecutive"),
        (_hosts(4, 2), 0.05, 0.1, "< 10%"),
        (_hosts(4, 2), 0.3, 0.4, ">= 30%"),
        ({**_hosts(4, 2), 3: None}, 0.3, 0.1, "unknown"),
    ],
)
def test_plan_refused_outside_the_limits(hosts, lost, share, why):
    p = plan(hosts, lost, share, 0.0)
    assert not p["applies"] and why in p["reason"]


def test_overlap_cost_can_outweigh_the_gain():
    p = plan(_hosts(4, 2), lost_fraction=0.12, late_share=0.125, overlapped_comm_fraction=0.10)
    assert not p["applies"] and "overlap" in p["reason"]


def test_rotating_job_on_two_hosts_gets_the_plan_first():
    world, steps = 8, 24
    rng = random.Random(7)
    late = [[0.0] * steps for _ in range(world)]
    for s in range(steps):
        if rng.random() < 0.4:
            late[rng.randrange(world)][s] = 60.0
    jit = [[[rng.randint(0, 200_000) for _ in range(2)] for _ in range(steps)] for _ in range(world)]
    d = diagnose(make_job(world, steps, late_ms=late, jitter_ns=jit, hosts=["a"] * 4 + ["b"] * 4))
    # one random rank per stalled step: the slowdown moves between ranks (stragglers.kinds)
    assert d.stragglers.kind == "rotating" and (d.stragglers.lost_fraction or 0) >= 0.10
    rec = d.recommendations[0]  # the plan comes first
    assert rec["id"] == "straggler-intermittent" and rec["severity"] == "high"
    p = rec["evidence"]["hsgd_plan"]
    assert p["hosts"] == 2 and p["ranks_per_host"] == [4]
    assert p["applies"] and p["period_group_size_dict"] == [[2, 8]] and p["warmup_steps"] == 1000
    assert p["expected_gain_fraction_max"] == pytest.approx(p["lost_fraction"] * 0.5, abs=1e-3)
    assert "period_group_size_dict [[2, 8]]" in rec["action"]
