"""Real 8-rank gloo mesh jobs traced beside two CPU burners (``tests/data/cpu_jobs/README.md``):
what the host does to them is not a straggler.

* ``mesh_dp_tp_slow_rank5_loaded_link`` (DP 2 x TP 4, rank 5 sleeps 40 ms before each
  backward): rank 7's collectives ended a few ms after its peers' at 25 of the 96 instances,
  all of them in its own two groups, where one of four or one of two members ends last anyway;
  read against 1/8, the chance of a job-wide collective, it was named a slow link.
* ``mesh_dp_pp_heavy_stage2_loaded`` (DP 2 x PP 4, stage 2 has 3x the layers, nobody sleeps):
  the host held replica 1 back in one step, and the replica what-if named its four ranks
  intermittent stragglers.
* ``mesh_dp_pp_heavy_stage2_loaded_hiccup`` (the same job, another run): the host held ranks
  back in two steps, four of them in one step and two in the other, and the rules named five
  ranks intermittent stragglers, each late in one step of eight.
* ``mesh_dp_pp_slow_replica_loaded_subset`` (DP 2 x PP 4, replica 1 = ranks 4-7 sleeps 40 ms every
  step): the replay read the other replica's wait at its data-parallel all-reduce as work, saw
  the job 4 % slower than its ideal where the arrivals show the replica costing 48 % of step
  time, and its explaining set of three of the four ranks replaced the rules' ranks.

* ``mesh_dp_pp_slow_rank5_loaded`` (DP 2 x PP 4, rank 5 alone sleeps 40 ms every step): its
  pipeline neighbours wait for it, then its replica reaches the data-parallel all-reduces last;
  the replay's set, rank 5, recovers 95 % of the slowdown and the whole replica 100 %, and the
  replica was named.

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


def test_ranks_the_host_held_back_once_each_are_no_stragglers() -> None:
    """The rules charge every late arrival to the step (about 10 % for seven ranks); the replay,
    which reproduces every step, finds the delays hidden in the pipeline's waits or in one rank
    late in two steps: fixing what it finds saves under 5 % of step time."""
    job = JOBS / "mesh_dp_pp_heavy_stage2_loaded_hiccup"
    assert slept_ranks(job) == [] and len(list(job.glob("rank-*.steps.jsonl"))) == 8
    s = diagnose(job).stragglers
    assert s.kind == "none" and s.ranks == [], (s.ranks, s.reason)
    assert "each stalled in fewer than 3 steps" in s.reason
    wi = s.whatif
    assert wi is not None and wi["fidelity"] <= 0.01 and wi["lost_fraction"] < 0.05
    assert all(len(n["late_steps"]) < 3 for n in wi["explaining_set"]), wi["explaining_set"]


def test_a_replica_sleeping_in_every_step_is_seen_whole_by_the_replay() -> None:
    """The fast replica's ranks wait for the slow one at their data-parallel all-reduces; read
    as waits, not work, the replay sees the sleep: fixing the replica recovers nearly all of a
    slowdown above 1.3x, in every step, and the verdict names it persistent."""
    job = JOBS / "mesh_dp_pp_slow_replica_loaded_subset"
    assert slept_ranks(job) == [4, 5, 6, 7]
    s = diagnose(job).stragglers
    assert sorted(s.ranks) == [4, 5, 6, 7] and s.kind == "persistent", (s.ranks, s.kind, s.reason)
    wi = s.whatif
    assert wi is not None and wi["slowdown"] > 1.3, wi and wi["slowdown"]
    rep = wi["replica"]
    assert rep["ranks"] == [4, 5, 6, 7] and rep["recovered"] > 0.9 and len(rep["late_steps"]) == wi["steps"]


def test_a_slowed_pipeline_rank_is_named_not_its_replica() -> None:
    """The smallest set that explains the slowdown is named: the replica saves under
    ``search.MIN_GAIN`` of step time more than rank 5 alone."""
    job = JOBS / "mesh_dp_pp_slow_rank5_loaded"
    assert slept_ranks(job) == [5]
    s = diagnose(job).stragglers
    assert s.ranks == [5] and s.kind == "persistent", (s.ranks, s.kind, s.reason)
    wi = s.whatif
    assert wi is not None and wi["replica"] is not None and wi["replica"]["ranks"] == [4, 5, 6, 7]
    assert [n["rank"] for n in wi["explaining_set"]] == [5] and wi["recovered_fraction"] > 0.9
