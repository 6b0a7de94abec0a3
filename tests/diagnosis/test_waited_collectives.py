"""Collectives a rank waited for (``collectives.COLLECTIVES_SCHEMA.waited``) and what the replay
does with them; the echo of a slowed rank through a group it shares (``WhatIfReport.excess_work``).

Real jobs: ``tests/data/cpu_jobs`` (README). ``mesh_dp_tp_slow_rank5_waits`` is a real 8-rank DP 2 x
TP 4 gloo job whose rank 5 sleeps 40 ms before every backward (its ``rank-<R>.steps.jsonl``: the
job's own step log, ``straggle_ms`` > 0 where it slept). Its tensor-parallel peers 4, 6, 7 wait for
rank 5 inside each synchronous ``dist.all_reduce`` and so reach their data-parallel all-reduces
last: before, the verdict named ranks 5, 4, 7 and 6.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kinetoscope.diagnosis import diagnose
from kinetoscope.diagnosis.whatif.build import Items, Visits, assemble
from kinetoscope.diagnosis.whatif.model import ReplayModel
from kinetoscope.diagnosis.whatif.p2p import p2p_links
from kinetoscope.diagnosis.whatif.replay import build_schedule, observed_replay
from kinetoscope.diagnosis.whatif.search import groups_per_lane
from tests.diagnosis.job_logs import one_step_info, slept_ranks

JOBS = Path(__file__).resolve().parents[1] / "data" / "cpu_jobs"
ECHO = JOBS / "mesh_dp_tp_slow_rank5_waits"


def test_synchronous_all_reduces_are_read_as_waited_for() -> None:
    # mesh_job.py calls dist.all_reduce without async_op: the training thread records nothing
    # until each collective ends, then resumes. Nearly all of them read as waited for on every
    # rank (a woken thread that waited for a core more than 2 ms is read as not waiting).
    d = diagnose(ECHO)
    for r, fig in d.job.figures.items():
        c = fig.collectives_of(r)
        assert c.height == 40 and int(c["waited"].sum()) >= 36, r


def test_a_pipeline_rank_waits_for_its_data_parallel_all_reduce() -> None:
    # gloo runs a point-to-point send or receive on the thread that calls it, so a pipeline
    # rank's gloo:send / gloo:recv annotations sit on its training thread, beside the
    # c10d::allreduce_ ops that thread issues. Read as a backend worker, that thread hid every
    # issue op: the all-reduces kept the worker's pick-up time as arrival and none read as
    # waited for, so the fast replica's wait for the slow one counted as its work.
    job = JOBS / "mesh_dp_pp_slow_replica_loaded_subset"
    d = diagnose(job)
    for r, fig in d.job.figures.items():
        c = fig.collectives_of(r)
        reduces = c.filter(c["coll"] == "allreduce")
        assert reduces.height == 8 and int(reduces["waited"].sum()) >= 6, (r, reduces["waited"].to_list())


def test_a_pipeline_stage_waiting_for_its_sends_is_not_working() -> None:
    """``mesh_dp_pp_slow_pair_1_6``: DP 2 x PP 4 (replicas 0-3 and 4-7), rank 1 (stage 1 of one
    replica) and rank 6 (stage 2 of the other) each sleep 40 ms every step. The pipeline
    schedule waits for its sends before it goes on, so rank 0 waits some 40 ms for rank 1 to
    receive its activations, and rank 5 for rank 6. Read as work, those waits made rank 0 look
    40 ms busier than its stage peer and rank 1 no busier than rank 5: the replay saw the job
    1.08x slower than its ideal and the verdict named ranks 0-3, a replica. The sends each
    forward waited for now read as waited (the link's ``waited``)."""
    job = JOBS / "mesh_dp_pp_slow_pair_1_6"
    assert slept_ranks(job) == [1, 6]
    d = diagnose(job)
    s = d.stragglers
    assert sorted(s.ranks) == [1, 6] and s.kind == "persistent", (s.ranks, s.kind, s.reason)
    wi = s.whatif
    assert wi is not None and wi["fidelity"] < 0.01 and wi["slowdown"] > 1.3, wi and wi["slowdown"]
    assert sorted(n["rank"] for n in wi["explaining_set"]) == [1, 6] and wi["recovered_fraction"] > 0.9
    links = p2p_links({r: f.p2p for r, f in d.job.figures.items()}, d.clock.offsets)
    sends = links.filter(links["is_send"])
    # each forward's last send is waited for: one in four per micro-batch set, on stages 0-2
    assert 0 < int(sends["waited"].sum()) < sends.height


def test_ddp_buckets_issued_during_backward_are_not_waited_for() -> None:
    # DDP issues its buckets while backward goes on and waits once, for the last, before the
    # optimizer step: at most one waited-for collective per rank and step.
    d = diagnose(JOBS / "clean_w5_loaded")
    steps = d.steps["step"].n_unique()
    for r, fig in d.job.figures.items():
        c = fig.collectives_of(r)
        assert 0 < int(c["waited"].sum()) <= steps, r


def _two_lanes(waited: bool) -> ReplayModel:
    """Lane 0 issues A at 1 and waits for it (lane 1 arrives at 4; A ends at 4.5), works 1,
    then issues B at 5.5; lane 1 issues B at 4.6. B ends at 6.0."""
    v = Visits(
        lane=np.array([0, 1, 0, 1, 0, 1]),
        step=np.zeros(6, dtype=np.int64),
        chain=np.array([0, 0, 1, 1, 2, 2]),
        sync=np.array([0, 0, 1, 1, 2, 3]),
        arrival=np.array([1.0, 4.0, 5.5, 4.6, 6.0, 6.0]),
        finish=np.array([4.5, 4.5, 6.0, 6.0, 6.0, 6.0]),
        is_async=np.array([True, True, True, True, False, False]),
        waited=np.array([waited, False, False, False, False, False]),
    )
    items = Items(
        np.arange(6), np.zeros(6, dtype=np.int64), np.array([1.0, 4.0, 1.0, 0.6, 0.0, 0.0]), np.ones(6)
    )
    return assemble(v, items, one_step_info(6.0))


def test_after_a_waited_for_visit_the_lane_works_from_its_end() -> None:
    m = _two_lanes(waited=True)
    assert observed_replay(m, build_schedule(m)).tolist() == [6.0]
    # read as asynchronous, lane 0's work after A would start at its issue: B at 4.6, ends 5.1
    m = _two_lanes(waited=False)
    assert observed_replay(m, build_schedule(m)).tolist() == pytest.approx([5.1])


def test_ranks_in_two_groups_or_more_are_counted_by_their_member_sets() -> None:
    m = _two_lanes(waited=True)
    assert groups_per_lane(m).tolist() == [1, 1]  # A and B: the same two members
    d = diagnose(ECHO)  # DP 2 x TP 4: every rank in its tensor-parallel group and its DP pair
    wi = d.stragglers.whatif
    assert wi is not None and sorted(wi["excess_work"], key=int) == [str(r) for r in range(8)]


def test_tensor_parallel_peers_late_only_by_waiting_for_the_slowed_rank_are_not_named() -> None:
    assert slept_ranks(ECHO) == [5]
    d = diagnose(ECHO)
    s = d.stragglers
    assert s.ranks == [5] and s.kind == "persistent", (s.ranks, d.summary()[:1])
    wi = s.whatif
    assert wi is not None and [n["rank"] for n in wi["explaining_set"]] == [5]
    assert wi["fidelity"] < 0.01
    # 4, 6 and 7 work like the typical peer: their lateness was the wait for rank 5
    for r in ("4", "6", "7"):
        assert wi["excess_work"][r] < 0.05
    assert wi["excess_work"]["5"] > 0.2
    assert "not named: ranks 4, 6, 7" in s.reason
    assert d.summary()[0].split(":", 1)[1].count("rank ") == 1


def test_a_one_group_job_reports_no_excess_work() -> None:
    # one job-wide group: lateness cannot carry from one group into another, and ranks late
    # together mask each other in the last-minus-next-latest measure: nothing is reported
    wi = diagnose(JOBS / "steady_spiky_w8").stragglers.whatif
    assert wi is not None and wi["excess_work"] == {}


def test_reading_the_waits_warns_nothing() -> None:
    # `kscope analyze` shows the user what the libraries warn: reading the waits must add no
    # line (polars warns on an as-of join by group unless told its inputs are sorted)
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert diagnose(ECHO).stragglers.ranks == [5]
    assert not [w for w in seen if "ortedness" in str(w.message)], [str(w.message) for w in seen]
