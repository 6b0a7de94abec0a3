"""Slow link on one rank: its collectives end late after its peers' (issue 9, cause "slow link").

The scenario is a real GPU rank trace (``hta/timeline_analysis/sampled_rank-0``) replicated into
4 ranks and re-timed by the benchmark's generator with rank 1's own collective durations
stretched (``benchmarks/diag_scenarios/gpu.py``). Its late ends fall mostly on the step's last
collectives, so its next arrival shows little of them: the arrival evidence alone missed it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.diag_scenarios import gpu
from kinetoscope.diagnosis import diagnose
from kinetoscope.diagnosis.stragglers import StragglerThresholds, _Matrix, _slow_link


@pytest.fixture(scope="module")
def slow_link_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[gpu.Scenario, list[str]]:
    sc = gpu.make_scenario("slow_link", "sampled128", 4, 0)
    out = tmp_path_factory.mktemp("slow_link")
    return sc, [str(p) for p in gpu.build(sc, Path(out))]


def test_slow_link_rank_is_named_with_its_cause(slow_link_job):
    sc, paths = slow_link_job
    diag = diagnose(paths)
    s = diag.stragglers
    assert s.kind == "persistent" and s.ranks == sc.ranks == [1], diag.render_text()
    cause = s.causes[1]
    assert cause["explained_by"] == "slow_link"
    c = cause["components"]["slow_link"]
    assert c["late_ends"] >= 2 and c["p_value"] < s.thresholds.alpha and c["share_of_step"] >= s.thresholds.rel_step
    line = diag.verdict_lines()[0]
    assert "rank 1" in line and "slow link / its collectives' transfer" in line
    assert f"{c['late_ends']}/{c['instances']} collectives" in line


def test_without_the_end_route_the_arrivals_alone_miss_it(slow_link_job):
    """The regression this route fixes: the same job with the route switched off."""
    _sc, paths = slow_link_job
    s = diagnose(paths, thresholds=StragglerThresholds(link_min_ranks=99)).stragglers
    assert s.kind == "none"


def _mx(E: np.ndarray, steps: int = 1) -> _Matrix:
    n_inst, n = E.shape
    idx = np.repeat(np.arange(steps), n_inst // steps)
    return _Matrix(list(range(n)), list(range(steps)), E.copy(), idx, np.median(E, axis=1).astype(np.int64), E)


def test_clean_ends_within_microseconds_name_nobody():
    """Real NCCL kernels of one instance end within a few µs on every rank (the DLRM job: <= 4 µs)."""
    rng = np.random.default_rng(0)
    E = (np.arange(40)[:, None] * 1_000_000 + rng.integers(0, 4_000, size=(40, 8))).astype(np.int64)
    assert _slow_link(_mx(E, 4), StragglerThresholds(), total_T=4 * 10_000_000.0, skip=set()) == []


def test_two_ranks_are_not_judged_by_ends():
    """With two ranks the clocks are aligned on collective ends: a late end is a clock offset."""
    E = np.array([[0, 5_000_000]] * 8, dtype=np.int64) + np.arange(8)[:, None] * 10_000_000
    assert _slow_link(_mx(E), StragglerThresholds(), total_T=80_000_000.0, skip=set()) == []


def test_late_ends_spread_over_ranks_are_noise_not_a_link():
    """Every rank ends late once: the late ends are not concentrated on one rank (binomial)."""
    E = np.arange(8)[:, None] * 10_000_000 + np.zeros((8, 4), dtype=np.int64)
    for i in range(8):
        E[i, i % 4] += 2_000_000
    assert _slow_link(_mx(E), StragglerThresholds(), total_T=80_000_000.0, skip=set()) == []


def test_recommendation_says_late_ends_not_late_arrivals(slow_link_job):
    _sc, paths = slow_link_job
    recs = [r for r in diagnose(paths).recommendations if r["id"] == "straggler-persistent"]
    assert len(recs) == 1 and "end late after its peers' (slow link" in recs[0]["title"]
