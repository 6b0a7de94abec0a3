"""Steady lateness (``kinetoscope.diagnosis.stragglers.steady``): the t-test's tail, the per-step skews, and
the verdict on a small steady delay hidden by a loaded host's bursts of noise."""

from __future__ import annotations

import math

import numpy as np
import pytest
from diag_synth import make_job

from kinetoscope.diagnosis import StragglerThresholds, diagnose
from kinetoscope.diagnosis.attribution import Matrix
from kinetoscope.diagnosis.stragglers import naming as straggler_naming
from kinetoscope.diagnosis.stragglers.steady import mean_t_sf, step_skews, student_t_sf


@pytest.mark.parametrize("t", [-3.0, -0.5, 0.0, 0.3, 1.0, 2.5, 7.0, 40.0])
def test_student_t_tail_matches_the_closed_forms(t):
    # df = 1 is the Cauchy distribution, df = 2 has a closed form too, a large df is the normal
    assert student_t_sf(t, 1) == pytest.approx(0.5 - math.atan(t) / math.pi, rel=1e-9, abs=1e-12)
    assert student_t_sf(t, 2) == pytest.approx(0.5 - t / (2 * math.sqrt(2 + t * t)), rel=1e-9, abs=1e-12)
    assert student_t_sf(t, 100_000) == pytest.approx(0.5 * math.erfc(t / math.sqrt(2)), rel=1e-3, abs=1e-12)


def test_student_t_tail_at_the_tabled_critical_values():
    # the one-sided 0.025 and 0.005 critical values of t with 15 degrees of freedom
    assert student_t_sf(2.131, 15) == pytest.approx(0.025, abs=1e-4)
    assert student_t_sf(2.947, 15) == pytest.approx(0.005, abs=1e-4)


def test_mean_t_sf_edge_cases():
    assert mean_t_sf(np.array([1.0])) == 1.0  # one step: no spread to test against
    assert mean_t_sf(np.array([2.0, 2.0, 2.0])) == 0.0  # the same positive skew every step
    assert mean_t_sf(np.array([-1.0, -1.0])) == 1.0
    assert mean_t_sf(np.array([1.0, -1.0, 2.0, -2.0])) == pytest.approx(0.5)


def test_step_skews_against_the_other_free_ranks_mean():
    # 4 ranks, 2 steps of 2 instances; rank 3 is a named straggler 50 late at every instance
    A = np.array(
        [[0, 10, 4, 50], [100, 106, 98, 150], [200, 212, 204, 250], [300, 308, 296, 350]], dtype=np.int64
    )
    mx = Matrix([0, 1, 2, 3], [0, 1], A, np.array([0, 0, 1, 1]), np.median(A, axis=1).astype(np.int64))
    # rank 1 against the mean of ranks 0 and 2 only: (10 - 2 + 106 - 99) / 2, (212 - 202 + 308 - 298) / 2
    assert step_skews(mx, 1, {3}).tolist() == pytest.approx([7.5, 10.0])
    # counted as a peer, the named rank pulls the others' mean up: rank 1 reads early
    assert step_skews(mx, 1, set()).tolist() == pytest.approx([-9.0, -20 / 3])
    assert step_skews(mx, 1, {0, 2, 3}).size == 0  # no free peer to compare with
    assert step_skews(mx, 1, {0, 3}).size == 0  # one of three: the peers left may be the early ones


def _bursty_job(world: int, seed: int, late_ms: float = 0.0):
    """16 steps of 60 ms, 2 collectives each; every arrival jitters by 1 ms and, with chance 0.3,
    a 2-10 ms burst (a host that deschedules processes now and then); rank 1 ``late_ms`` late."""
    rng = np.random.default_rng(seed)
    steps = 16
    jit = rng.normal(0, 1e6, size=(world, steps, 2))
    jit += (rng.random((world, steps, 2)) < 0.3) * rng.uniform(2e6, 10e6, size=(world, steps, 2))
    late = [[late_ms if r == 1 else 0.0] * steps for r in range(world)]
    return make_job(world, steps, period_ms=60.0, late_ms=late, jitter_ns=jit.astype(int).tolist())


@pytest.fixture
def diagnose_without_steady(monkeypatch):
    """``diagnose`` with the steady-lateness test switched off (no rank is ever steadily late)."""

    def run(job):
        with monkeypatch.context() as m:
            m.setattr(straggler_naming, "steadily_late", lambda *a: False)
            return diagnose(job)

    return run


@pytest.mark.parametrize("seed", [217, 223, 228])
def test_small_steady_delay_under_bursts_is_persistent(seed, diagnose_without_steady):
    # rank 1 is 3 ms (5 % of a step) late at every collective, under bursts of up to 10 ms on
    # every rank: it is the last one in only some steps, and the frequency route alone calls it
    # arrival jitter; it is behind the others in nearly every step
    job = _bursty_job(4, seed, late_ms=3.0)
    assert diagnose_without_steady(job).stragglers.kind == "none"
    s = diagnose(job).stragglers
    assert s.kind == "persistent" and s.ranks == [1], s.reason
    ev = s.steady[1]
    assert ev["behind_steps"] >= 12 and ev["steps"] == 16
    assert ev["p_value"] < StragglerThresholds().steady_alpha / 4
    assert 0.01 <= ev["median_skew_share"] <= 0.1
    assert f"behind the others' mean arrival in {ev['behind_steps']}/16 steps" in s.reason
    assert ev["steadily_late"] is True and diagnose(job).to_dict()["stragglers"]["steady"]["1"] == ev
    assert f"behind the others in {ev['behind_steps']}/16 steps" in diagnose(job).summary()[0]


@pytest.mark.parametrize("world", [3, 4, 6])
def test_bursts_alone_are_not_a_steady_delay(world, diagnose_without_steady):
    # the same noise without a delay: whatever the verdict says of the bursts, the steady test
    # adds no rank to it (a rank picked for being last often has a positive mean skew, hence one
    # test alone needs steady_alpha: the t-test alone at alpha named the 3-rank job of seed 127)
    for seed in range(100, 130):
        job = _bursty_job(world, seed)
        s = diagnose(job).stragglers
        base = diagnose_without_steady(job).stragglers
        assert (s.kind, s.ranks) == (base.kind, base.ranks), (seed, s.reason)
