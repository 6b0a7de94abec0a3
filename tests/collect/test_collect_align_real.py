"""Aligned iteration windows on a real torchrun job (2 ranks, gloo, CPU).

`trigger_trace` of the job by job id, with no --iteration-roundup: the trigger lists the ranks,
picks a roundup R from their poll interval, and every rank starts at the same iteration. The
steps each rank traced are read from the job's own step log (matched by wall-clock time to the
trace's optimizer steps, ``tests/diagnosis/daemon_runs.ground_truth``), so the check does not
rely on anything Kinetoscope computed. The job has done only a few steps when it is triggered
(far fewer than R), so every rank picks the request up before step R and starts there: the test
is deterministic. Without the alignment each rank would start at its own next step after its
own poll, up to a poll interval (several steps here) apart.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kinetoscope.collect.trigger import Target, TraceOptions, TraceRequest, trigger_trace, wait_for_trace
from kinetoscope.protocol.manifest import read_manifest

pytestmark = [pytest.mark.torch, pytest.mark.slow]

ITERATIONS = 5


def test_ranks_of_a_job_trace_the_same_steps_by_default(tmp_path):
    pytest.importorskip("torch")
    from kinetoscope.demo.local import LocalDaemon, TrainingJob
    from tests.diagnosis.daemon_runs import ground_truth

    job_id = random.Random(7).randint(10_000, 2**31 - 1)
    with LocalDaemon(tmp_path) as daemon:
        env = {**daemon.kineto_env(), "SLURM_JOB_ID": str(job_id)}
        with TrainingJob(
            tmp_path,
            ranks=2,
            steps=0,
            model="tiny",
            max_seconds=280,
            env=env,
            extra_args=["--step-sleep-ms", "60", "--quiet"],
        ) as job:
            daemon.wait_for_processes(2, job_id=job_id, timeout=120, alive=job.alive)
            job.wait_for_steps(3, timeout=120)
            res = trigger_trace(
                TraceRequest([daemon.address], Target(job_id=job_id), TraceOptions(iterations=ITERATIONS))
            )
            assert res.ok, [e.message for e in res.errors]
            roundup = res.options.iteration_roundup
            assert roundup is not None and roundup >= 100, res.notes
            assert any(
                n.startswith(f"aligning 2 processes: each starts at the next multiple of {roundup}")
                for n in res.notes
            ), res.notes
            at_trigger = max(d["step"] for d in job.progress().values())
            assert at_trigger < roundup // 2  # so every rank picks it up before step R (see docstring)
            res = wait_for_trace(res, timeout=240)
            assert res.ok, [e.message for e in res.errors] + [job.tail()]
            job.stop_once_logged()
    trace_dir = Path(res.output_dir or "")
    files = {f.rank: str(trace_dir / f.file) for f in read_manifest(trace_dir).files}
    assert sorted(files) == [0, 1]
    # raises unless both ranks traced the same consecutive job steps
    steps, _ = ground_truth(job, files, roundup, ITERATIONS)
    assert abs(steps[0] - roundup) <= 1, steps  # the window starts at R (Kineto counts from 0 or 1)
