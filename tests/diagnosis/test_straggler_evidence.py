"""The evidence a straggler verdict shows, on re-timed real GPU traces (issue 9).

Scenarios come from the benchmark's generator (``benchmarks/diag_scenarios/gpu.py``) on the
in-repository real traces; labels are checked against the standard-library arrival-order
ground truth (``truth.py``), not against the product.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.diag_scenarios import gpu, truth
from kinetoscope.diagnosis import diagnose
from kinetoscope.diagnosis.stragglers import StragglerThresholds


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
        m = re.search(rf"rank {r} (?:last at [^;]*?, )?stalled beyond the noise in (\d) step\(s\) \(up to ([\d.]+) ms\)",
                      s.reason)
        assert m, s.reason
        assert float(m.group(2)) >= 0.2 * gpu.load_base("nccl_parser").step_us / 1000.0  # injected: 20-60 % of a step


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
