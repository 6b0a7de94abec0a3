"""The human verdict of jobs with a seed problem: uneven inputs lead (their collectives are not
a straggler's), a pipeline's bubble and imbalance take the first line; other jobs keep the
straggler verdict as it was. At most two lines, every number the named stage's or rank's."""

from __future__ import annotations

from diag_synth import make_job

from kinetoscope.diagnosis import diagnose
from kinetoscope.diagnosis.extras import pipeline_line, uneven_lines
from kinetoscope.diagnosis.result import Diagnosis

UNEVEN = {
    "mode": "join",
    "short_ranks": [1],
    "waiting_ranks": [],
    "steps_per_rank": {"0": 6, "1": 3, "2": 6},
    "lost_fraction": 0.31,
}
PIPE = {
    "schedule": "gpipe",
    "num_stages": 2,
    "replicas": 1,
    "microbatches": 4,
    "bubble_fraction": 0.42,
    "expected_bubble_fraction": 0.2,
    "step_time_ms": 120.0,
    "imbalance": {
        "slowest_stage": 1,
        "slowest_ranks": [1],
        "excess_fraction": 0.46,
        "est_step_time_balanced_ms": 95.5,
    },
}


def test_a_job_without_seed_problems_keeps_the_straggler_verdict():
    late = [[0.0] * 8, [30.0] * 8, [0.0] * 8]  # rank 1 arrives 30 ms late at every step
    d = diagnose(make_job(world=3, steps=8, late_ms=late))
    assert d.uneven_inputs is None and d.pipeline is None
    assert d.verdict_lines() == Diagnosis.verdict_lines(d)
    assert d.verdict_lines()[0].startswith("PERSISTENT STRAGGLER")


def test_uneven_inputs_lead_the_verdict():
    d = diagnose(make_job(world=3, steps=8))
    d.uneven_inputs = UNEVEN
    lines = d.verdict_lines()
    assert len(lines) == 2 and lines == uneven_lines(UNEVEN)
    assert lines[0].startswith("UNEVEN INPUTS (join): rank 1 ran out of data first")
    assert "rank 0: 6, rank 1: 3, rank 2: 6" in lines[0] and "31% of the time lost" in lines[0]
    assert "Join" in lines[1] and "drop_last" in lines[1]


def test_pipeline_line_names_the_slowest_stage_with_its_own_numbers():
    d = diagnose(make_job(world=3, steps=8))
    d.pipeline = PIPE
    lines = d.verdict_lines()
    assert len(lines) == 2 and lines[0] == pipeline_line(PIPE) and lines[1].startswith("NO STRAGGLER")
    assert lines[0] == (
        "PIPELINE-PARALLEL (gpipe, 2 stages, 4 micro-batches): bubble 42% of the step (the schedule's own: 20%); "
        "slowest stage 1 (rank 1) computes 46% above the mean stage; balanced: 120.0 -> 95.5 ms per step."
    )
