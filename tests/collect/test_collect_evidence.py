"""What ``kscope trace`` says about what it captured (issue 28): the roundup fits the wait,
and the files read back are judged with the diagnosis' evidence (``kinetoscope.readback``,
the structs of ``collect.captured``)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kinetoscope.collect.captured import UNUSABLE_EXIT, unusable
from kinetoscope.collect.render import captured_lines
from kinetoscope.collect.trigger import Target, TraceFile, TraceOptions, TraceResult, align_roundup
from kinetoscope.collect.window_fit import fit_roundup, nice_values
from kinetoscope.readback import check_captured, probe_steps

DATA = Path(__file__).resolve().parents[1] / "data"
CASES = DATA / "malformed_jobs"
CLEAN = DATA / "cpu_jobs" / "small_steady_w4"


def test_kineto_default_poll_and_a_60_s_timeout_get_a_roundup_that_fits():
    """The field failure: 6 ranks, Kineto's 5 s poll, --iterations 20 --wait --timeout 60. The
    safe roundup (1,000 at 10 steps/s) would start up to 100 s later."""
    safe = align_roundup(5.0)
    assert safe == 1000
    fit = fit_roundup(safe, 10.0, 5.0, 0.5, 20, 60.0)
    assert fit.fits and fit.roundup == 200 and fit.expected_end_s <= 30.0
    assert fit.misalign_odds == pytest.approx(55 / 200)
    note = fit.note(10.0, 5.0, 20)
    assert note is not None and "--iteration-roundup 200 (not the safest 1000)" in note
    assert "fits --timeout 60" in note


def test_safe_roundup_kept_when_it_fits_and_without_a_wait():
    assert fit_roundup(200, 10.0, 1.0, 0.5, 10, 120.0).roundup == 200
    assert fit_roundup(200, 10.0, 1.0, 0.5, 10, 120.0).note(10.0, 1.0, 10) is None
    assert fit_roundup(1000, 10.0, 5.0, 0.5, 20, None).roundup == 1000


def test_a_wait_too_short_for_any_alignment_is_said_with_the_figures():
    fit = fit_roundup(1000, 10.0, 5.0, 0.5, 20, 10.0)
    assert not fit.fits and fit.roundup == 200
    note = fit.note(10.0, 5.0, 20) or ""
    assert note.startswith("aligned windows cannot fit --timeout 10: at 10 steps/s and a 5 s poll interval")
    assert "give --timeout 58 or more" in note and "--when-stepping" in note


def test_nice_values():
    assert nice_values(110, 1000) == [1000, 500, 200]
    assert nice_values(1, 5) == [5, 2, 1]


def _result(files: list[Path], iterations: int | None = 10) -> TraceResult:
    opts = TraceOptions(iterations=iterations) if iterations else TraceOptions(duration_ms=500)
    res = TraceResult(trace_id="kst-test", hosts=[], target=Target(job_id=42, job_id_text="42"), options=opts)
    for k, f in enumerate(files):
        res.files.append(TraceFile(host="h", pid=100 + k, rank=k, path=str(f), complete=True, exists=True))
    res.waited = True
    return res


def test_clean_set_is_usable():
    res = _result(sorted(CLEAN.glob("rank-*")), iterations=16)
    cap = check_captured(res).to_json()
    assert cap["checked"] and cap["usable"] and cap["steps_in_common"] == 16
    assert [f["iterations"] for f in cap["files"]] == [16, 16, 16, 16]
    assert not unusable(cap)
    assert captured_lines(cap)[0] == "usable for a verdict (16 steps held by every rank)"


def test_empty_file_makes_the_set_unusable():
    res = _result(sorted((CASES / "empty_rank2_w4").glob("rank-*")))
    cap = check_captured(res).to_json()
    assert unusable(cap) and UNUSABLE_EXIT == 3
    assert cap["reason"].startswith("rank 2: trace file empty (0 events)")
    assert [f["empty"] for f in cap["files"]] == [False, False, True, False]
    assert cap["command"] == "kscope trace --job-id 42 --iterations 20 --when-stepping --wait"
    lines = captured_lines(cap)
    assert lines[0].startswith("NOT USABLE for a cross-rank verdict: rank 2: trace file empty")
    assert "trace again with: kscope trace --job-id 42 --iterations 20 --when-stepping --wait" in lines


def test_windows_that_do_not_overlap_are_unusable_and_said():
    cap = check_captured(_result(sorted((CASES / "disjoint_windows_w4").glob("rank-*")))).to_json()
    assert unusable(cap) and cap["windows_overlap"] is False
    assert "windows not aligned: the ranks traced different steps" in captured_lines(cap)
    assert [f["iterations"] for f in cap["files"]] == [6, 6, 7, 7]
    assert all(f["iterations_asked"] == 10 for f in cap["files"])


def test_a_rank_that_fell_back_to_a_duration_trace_is_named(tmp_path):
    """A rank without the iteration hook traces Kineto's 500 ms instead of the iterations asked."""
    from tests.data.malformed_jobs.make_cases import _step_starts, _window, _write

    files = []
    for f in sorted(CLEAN.glob("rank-*")):
        with gzip.open(f, "rt") as fh:
            doc = json.load(fh)
        if f.name.startswith("rank-1_"):
            s = _step_starts(doc)
            doc = _window(doc, s[2] - 1.0, s[2] + 500_000.0)
        _write(doc, tmp_path / f.name)
        files.append(tmp_path / f.name)
    cap = check_captured(_result(files, iterations=16)).to_json()
    by_rank = {f["rank"]: f for f in cap["files"]}
    assert by_rank[1]["fell_back_to_duration"] and by_rank[1]["iterations"] < 16
    assert not any(by_rank[r]["fell_back_to_duration"] for r in (0, 2, 3))


def test_a_fast_job_that_fell_back_is_named_though_it_holds_more_steps_than_asked():
    """Four ranks reached before their first optimizer step: 500 ms windows of a 45 ms-step job
    hold 11-12 steps, more than the 10 asked (the early-trace CI failure; they were not named)."""
    files = sorted((DATA / "cpu_jobs" / "early_fallback_staggered_w4").glob("rank-*"))
    cap = check_captured(_result(files, iterations=10)).to_json()
    assert [f["iterations"] for f in cap["files"]] == [11, 11, 11, 12]
    assert all(f["fell_back_to_duration"] for f in cap["files"])
    assert cap["usable"] and "reached 4 rank(s) before their first optimizer step" in cap["warming_up"]
    assert "fewer iterations" not in cap["warming_up"]


def test_remote_files_are_not_read_back():
    res = _result([Path("/nonexistent/rank-0_1.pt.trace.json")])
    cap = check_captured(res).to_json()
    assert cap["checked"] is False and not unusable(cap)


def test_probe_reading_of_a_stepping_job_and_of_a_one_step_window():
    """``--when-stepping``'s probe reading (``collect.stepping.read_probe`` with the step reader
    ``kscope trace`` passes, ``readback.probe_steps``) on real files."""
    from kinetoscope.collect.stepping import read_probe

    steps, rate, steady = read_probe(str(sorted(CLEAN.glob("rank-0_*"))[0]), probe_steps)
    assert steps == 16 and steady and rate is not None and 10 < rate < 30  # ~53 ms steps
    steps, rate, steady = read_probe(str(sorted((CASES / "one_step_w4").glob("rank-0_*"))[0]), probe_steps)
    assert steps == 1 and rate is None and not steady
