"""The evidence block and the verdict that follows it (issue 28), on real traces made malformed.

Every case of ``tests/data/malformed_jobs`` (derived from the real 4-rank CPU job
``cpu_jobs/small_steady_w4``, where rank 0 is a persistent straggler: ``make_cases.py``) is
diagnosed as ``kscope analyze`` would; each test asserts its evidence line and its headline.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kinetoscope.diagnosis import diagnose
from kinetoscope.trace import load_trace

DATA = Path(__file__).resolve().parents[1] / "data"
CASES = DATA / "malformed_jobs"
CLEAN = DATA / "cpu_jobs" / "small_steady_w4"


def _run(folder: Path, salvage: bool = False):
    files = sorted(folder.glob("rank-*"))
    d = diagnose([load_trace(f, salvage=salvage, cache=False) for f in files])
    return d, list(d.summary()), d.to_dict()["evidence"]


def _kinds(ev: dict) -> set[str]:
    return {a["kind"] for a in ev["anomalies"]}


def test_clean_job_has_evidence_and_keeps_its_verdict():
    d, summary, ev = _run(CLEAN)
    assert summary[0].startswith("PERSISTENT STRAGGLER: rank 0"), summary
    assert (
        summary[2]
        == "Evidence: steps per rank 0: 16, 1: 16, 2: 16, 3: 16; 16 in common; windows aligned; 0 anomalies."
    )
    assert ev["assessed"] and not ev["anomalous"] and ev["steps_in_common"] == 16
    assert ev["windows_overlap"] and ev["windows_aligned"] and ev["timestamp_anomalies"] == 0
    assert d.stragglers.confidence == "high"


def test_truncated_rank_is_named_and_never_read_as_uneven_inputs():
    d, summary, ev = _run(CASES / "truncated_rank1_w4", salvage=True)
    assert summary[0].startswith("[ON ANOMALOUS DATA: salvaged; confidence lowered] ")
    assert "UNEVEN INPUTS" not in summary[0]
    assert d.to_dict()["uneven_inputs"] is None
    assert {"salvaged", "uneven_inputs_not_assessed"} <= _kinds(ev)
    line = next(s for s in summary if s.startswith("Evidence:"))
    assert "steps per rank 0: 16, 1: 9, 2: 16, 3: 16" in line
    assert "rank 1's file is damaged and was salvaged" in line
    left = next(s for s in summary if s.startswith("Left out: "))
    assert "the uneven-inputs verdict" in left
    assert ev["confidence_lowered"] and d.stragglers.confidence in ("medium", "low")


def test_empty_rank_file_is_named_not_assessed():
    d, summary, ev = _run(CASES / "empty_rank2_w4")
    assert summary[0] == "NOT ASSESSED: rank 2: trace file empty (0 events): rank-2_23676.pt.trace.json.gz."
    assert summary[1].startswith("For a trace that can be assessed: kscope trace ")
    assert "--iterations 20 --when-stepping --wait" in summary[1]
    line = summary[2]
    assert line.startswith("Evidence: steps per rank 0: 16, 1: 16, 2: 0, 3: 16; 0 in common;")
    assert "rank 2's trace is empty (0 events)" in line
    assert not ev["assessed"] and "empty_file" in _kinds(ev)
    # no straggler verdict or recommendation rests on traces that cannot carry one
    assert d.stragglers.kind == "not_assessed" and d.stragglers.ranks == []
    assert not any(r["id"].startswith("straggler") for r in d.recommendations)
    from kinetoscope.orchestration import document_summary

    assert document_summary(d.to_dict())["straggler_kind"] == "not_assessed"


def test_single_empty_trace_is_named(tmp_path):
    f = tmp_path / "rank-0_1.pt.trace.json"
    f.write_text('{"schemaVersion": 1, "traceEvents": []}')
    _, summary, ev = _run(tmp_path)
    assert summary[0] == "NOT ASSESSED: rank 0: trace file empty (0 events): rank-0_1.pt.trace.json."
    assert "no steps found" not in summary[0]
    assert ev["ranks"][0]["empty"] is True


def test_missing_rank_is_named_and_the_verdict_covers_the_others():
    _, summary, ev = _run(CASES / "missing_rank2_w4")
    assert summary[0].startswith("PERSISTENT STRAGGLER: rank 0"), summary
    assert summary[2] == (
        "Evidence: steps per rank 0: 16, 1: 16, 3: 16; 16 in common; windows aligned; 1 anomaly: "
        "no trace of rank 2: the verdict covers the ranks traced."
    )
    assert ev["assessed"] and _kinds(ev) == {"missing_rank"}


def test_window_of_one_step_is_not_assessed():
    d, summary, ev = _run(CASES / "one_step_w4")
    assert summary[0].startswith("NOT ASSESSED: only ")
    assert (
        "2 needed (or 8 collectives in them; steps per rank: rank 0: 1, rank 1: 1, rank 2: 1, rank 3: 1)"
        in summary[0]
    )
    assert summary[2].startswith("Evidence: steps per rank 0: 1, 1: 1, 2: 1, 3: 1;")
    assert not ev["assessed"] and ev["steps_in_common"] < 3
    assert not any(r["id"].startswith("straggler") for r in d.recommendations)


def test_windows_that_do_not_overlap_are_not_assessed():
    _, summary, ev = _run(CASES / "disjoint_windows_w4")
    assert summary[0].startswith("NOT ASSESSED: the ranks' trace windows do not overlap (rank 0 0.00-")
    assert "; 0 in common; windows do NOT overlap;" in summary[2]
    assert ev["windows_overlap"] is False and not ev["assessed"]


def test_staggered_windows_never_give_uneven_inputs():
    """The shape of a trace taken while the ranks were starting: each rank's window starts a
    step later than the previous rank's. Whatever the verdict, not uneven inputs, and a named
    straggler can only be the real one (rank 0)."""
    d, summary, ev = _run(CASES / "staggered_windows_w4")
    assert "UNEVEN INPUTS" not in summary[0]
    assert d.to_dict()["uneven_inputs"] is None
    assert ev["windows_aligned"] is False and ev["steps_in_common"] == 5
    assert "; 5 in common; windows NOT aligned;" in summary[2]
    # each window ends inside the rank's next step: the join finding is not even made (it used
    # to be, and was then guarded for the windows' different starts)
    assert "uneven_inputs_not_assessed" not in _kinds(ev)
    assert set(d.stragglers.ranks) <= {0}


def test_single_process_with_fewer_steps_than_asked_warns(tmp_path):
    src = sorted(CLEAN.glob("rank-1_*"))[0]
    shutil.copy(src, tmp_path / src.name)
    manifest = {
        "kinetoscope_manifest": 1,
        "trace_id": "kst-t",
        "files": [{"file": src.name, "iterations": 20}],
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    _, summary, ev = _run(tmp_path)
    assert summary[0].startswith("[WARNING: the trace holds 16 of the 20 steps asked] SINGLE PROCESS:")
    assert summary[2].startswith("Evidence: 16 step(s) traced of 20 asked;")
    assert ev["steps_asked"] == 20 and "fewer_steps_than_asked" in _kinds(ev)


@pytest.mark.parametrize(
    "case", ["truncated_rank1_w4", "empty_rank2_w4", "one_step_w4", "disjoint_windows_w4"]
)
def test_cli_json_has_the_evidence_key(case, tmp_path):
    from typer.testing import CliRunner

    from kinetoscope.cli.main import app

    res = CliRunner().invoke(app, ["analyze", str(CASES / case), "--salvage", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["evidence"]["lines"] and doc["diagnosis_summary"][0].startswith(
        ("NOT ASSESSED", "[ON ANOMALOUS")
    )
