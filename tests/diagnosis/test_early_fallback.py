"""Iteration requests that reached the ranks before their first optimizer step (issue 27, the
early-trace CI failure): Kineto traced each as its default 500 ms duration trace, from when its
config arrived, so the windows start steps apart and each is cut inside a step.

The data (tests/data/cpu_jobs/README.md): a real 4-rank gloo job whose rank 1 sleeps 30 ms before
``backward()`` in every step (the job's own knob: the truth), traced 5 s after launch with
``--iterations 10``; and a 3 s duration trace of the same job, whose windows also start apart.
"""

from __future__ import annotations

from pathlib import Path

from kinetoscope.diagnosis import diagnose

DATA = Path(__file__).resolve().parents[1] / "data" / "cpu_jobs"
FALLBACK = DATA / "early_fallback_staggered_w4"
DURATION = DATA / "duration_windows_staggered_w4"


def test_the_staggered_fallback_names_the_injected_straggler_alone():
    # before: rank 2 (whose window started a step after the reference's) was paired one
    # collective off and read as a slow link ending 40 ms after its peers at every collective
    s = diagnose(FALLBACK).stragglers
    assert s.kind == "persistent" and s.ranks == [1], s.reason


def test_every_rank_is_paired_with_the_collective_that_ends_with_it():
    # one host, one clock: a rank paired with its own collective ends within a few ms of the
    # reference's (gloo's worker threads), one paired a step off ends a step (about 45 ms) apart
    clock = diagnose(FALLBACK).clock.table
    assert set(clock["method"].to_list()) == {"reference", "same_host"}
    assert max(clock["residual_us"].to_list()) < 5_000, clock


def test_the_fallback_is_named_and_not_counted_as_steps_missing():
    ev = diagnose(FALLBACK).evidence
    assert [r.steps for r in ev.ranks] == [11, 11, 11, 12] and ev.steps_asked == 10
    assert all(r.fell_back_to_duration for r in ev.ranks)
    kinds = {a.kind for a in ev.anomalies}
    assert "fell_back_to_duration" in kinds and "fewer_steps_than_asked" not in kinds
    fell = next(a for a in ev.anomalies if a.kind == "fell_back_to_duration")
    assert fell.ranks == [0, 1, 2, 3] and "500 ms duration trace" in fell.message and not fell.left_out
    assert ev.assessed and not ev.anomalous  # named, not held against the verdict


def test_a_duration_trace_is_not_taken_for_a_fallback():
    ev = diagnose(DURATION).evidence
    assert ev.steps_asked is None and not any(r.fell_back_to_duration for r in ev.ranks)


def test_a_window_cut_inside_the_next_step_is_not_uneven_inputs():
    # each rank's window ends inside a step whose all-reduce it has entered; before, the ranks
    # whose window ended first were found short of data (and the finding then guarded)
    for folder in (FALLBACK, DURATION):
        d = diagnose(folder)
        assert d.to_dict()["uneven_inputs"] is None
        assert "uneven_inputs_not_assessed" not in {a.kind for a in d.evidence.anomalies}
        assert d.stragglers.kind == "persistent" and d.stragglers.ranks == [1]
