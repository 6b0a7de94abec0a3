"""Real 8-rank gloo mesh jobs traced beside two CPU burners (``tests/data/cpu_jobs/README.md``):
what the host does to them is not a straggler.

* ``mesh_dp_tp_slow_rank5_loaded_link`` (DP 2 x TP 4, rank 5 sleeps 40 ms before each
  backward): rank 7's collectives ended a few ms after its peers' at 25 of the 96 instances,
  all of them in its own two groups, where one of four or one of two members ends last anyway;
  read against 1/8, the chance of a job-wide collective, it was named a slow link.
* ``mesh_dp_pp_heavy_stage2_loaded`` (DP 2 x PP 4, stage 2 has 3x the layers, nobody sleeps):
  the host held replica 1 back in one step, and the replica what-if named its four ranks
  intermittent stragglers.

Each job's ``rank-<R>.steps.jsonl`` is its own step log (``straggle_ms`` > 0 where it slept).
"""

from __future__ import annotations

from pathlib import Path

from kinetoscope.diagnosis import diagnose
from tests.diagnosis.job_logs import slept_ranks

JOBS = Path(__file__).resolve().parents[1] / "data" / "cpu_jobs"


def test_late_ends_within_small_groups_are_not_a_slow_link() -> None:
    job = JOBS / "mesh_dp_tp_slow_rank5_loaded_link"
    assert slept_ranks(job) == [5]
    d = diagnose(job)
    s = d.stragglers
    assert s.kind == "persistent" and s.ranks == [5], (s.ranks, d.summary()[:1])
    assert not any(c.get("explained_by") == "slow_link" for c in s.causes.values())


def test_a_replica_the_host_held_back_in_one_step_is_no_straggler() -> None:
    job = JOBS / "mesh_dp_pp_heavy_stage2_loaded"
    assert slept_ranks(job) == [] and len(list(job.glob("rank-*.steps.jsonl"))) == 8
    d = diagnose(job)
    assert d.stragglers.kind == "none", (d.stragglers.ranks, d.stragglers.reason)
    wi = d.stragglers.whatif
    assert wi is not None and wi["replica"] is not None and len(wi["replica"]["late_steps"]) < 3
    assert d.pipeline is not None
    assert (d.pipeline.get("imbalance") or {}).get("slowest_stage") == 2
