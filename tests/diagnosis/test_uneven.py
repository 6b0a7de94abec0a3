"""Uneven inputs (seed 004) on real DDP jobs (gloo, CPU, 3 ranks) whose rank 1 gets 3 fewer
batches, with and without ``Join``; the ground truth is each rank's own step counter."""

from __future__ import annotations

from pathlib import Path

import pytest
from diag_synth import make_job
from digests import assert_digests_diagnose_alike
from seed_jobs import run_torchrun

from kinetoscope.diagnosis import diagnose

pytest.importorskip("torch")


def _steps(out: Path) -> dict[str, int]:
    return {p.name.split("-")[1].split(".")[0]: int(p.read_text()) for p in out.glob("rank-*.steps")}


@pytest.fixture(scope="module")
def with_join(tmp_path_factory):
    out = tmp_path_factory.mktemp("uneven_join")
    # 20 ms of input loading per batch: a 3-step window of ~1 ms steps started ranks up to 17 ms
    # apart on a loaded host, beyond the evidence's tolerance (a step), so the finding was guarded
    args = ("--batches", "6", "--short-rank", "1", "--short-by", "3", "--input-ms", "20", "--join")
    run_torchrun("uneven_job.py", 3, out, *args)
    return diagnose(out), _steps(out)


@pytest.fixture(scope="module")
def without_join(tmp_path_factory):
    out = tmp_path_factory.mktemp("uneven_hang")
    run_torchrun(
        "uneven_job.py", 3, out, "--batches", "6", "--short-rank", "1", "--short-by", "3", "--timeout-s", "5"
    )
    return diagnose(out), _steps(out)


def test_join_short_rank_named_with_its_steps(with_join):
    d, truth = with_join
    assert truth == {"0": 6, "1": 3, "2": 6}
    u = d.to_dict()["uneven_inputs"]
    assert u["mode"] == "join" and u["short_ranks"] == [1]
    assert u["steps_per_rank"] == truth  # the trace's optimizer steps are the job's own count
    assert u["shadow_collectives"]["1"] >= 3  # it echoed the others' all-reduces of steps 4-6
    rec = next(r for r in d.recommendations if r["id"] == "uneven-inputs")
    assert "DistributedSampler" in rec["action"] and "Join" in rec["action"]


def test_without_join_the_others_hang_in_an_allreduce(without_join):
    d, truth = without_join
    assert truth["1"] == 3
    u = d.to_dict()["uneven_inputs"]
    assert u["mode"] == "unmatched" and u["short_ranks"] == [1] and u["waiting_ranks"] == [0, 2]
    un = u["unmatched_collective"]
    assert un["coll"] == "allreduce"
    assert all(w >= 4000 for w in un["waited_ms"].values())  # the 5 s process-group timeout
    rec = next(r for r in d.recommendations if r["id"] == "uneven-inputs")
    assert rec["severity"] == "high" and "Join" in rec["action"]


def test_even_job_and_short_trace_window_are_not_uneven():
    assert diagnose(make_job(world=3, steps=8)).to_dict()["uneven_inputs"] is None
    # rank 2's trace window ends two steps early: fewer steps, but no collectives after them
    d = diagnose(make_job(world=3, steps=8, skip_steps={2: {6, 7}}))
    assert d.to_dict()["uneven_inputs"] is None


def test_digests_give_the_uneven_inputs(with_join):
    """``kscope analyze`` diagnoses digests: the same finding from the ranks' figures."""
    assert_digests_diagnose_alike(with_join[0], "uneven_inputs")
