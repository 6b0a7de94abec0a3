"""The benchmark's report scores the targets twice: against the injected labels, and without the
CPU jobs whose label the arrival-order truth contradicts (both lines from saved outcomes)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.bench_diagnosis import main
from benchmarks.diag_scenarios.score import Outcome


def _saved(tmp_path: Path, outcomes: list[Outcome]) -> Path:
    path = tmp_path / "run.json"
    doc = {"commit": "abc", "command": "bench_diagnosis.py (test)", "seconds": 1.0}
    path.write_text(json.dumps(doc | {"scenarios": [o.to_dict() for o in outcomes]}))
    return path


def _small(sid: str, got: list[int], truth_ok: bool) -> Outcome:
    kind = "persistent" if got else "none"
    return Outcome(sid, "cpu", "small", "persistent", [1], kind, got, truth_ok=truth_ok)


def test_a_miss_the_truth_contradicts_is_scored_apart(tmp_path: Path, capsys) -> None:
    # 9 right verdicts and one `none` for a rank whose delay the host absorbed (label contradicted)
    outcomes = [_small(f"ok-{i}", [1], True) for i in range(9)] + [_small("absorbed", [], False)]
    out_json = tmp_path / "scored.json"
    assert main(["--from-json", str(_saved(tmp_path, outcomes)), "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    assert "Targets missed: cpu: overall rank recall 0.900 < 0.95" in text
    assert "Without the jobs whose label the truth contradicts: all targets met." in text
    doc = json.loads(out_json.read_text())
    assert doc["misses_truth"] == [] and doc["misses"]


def test_misses_the_truth_agrees_with_stay_missed(tmp_path: Path, capsys) -> None:
    outcomes = [_small(f"ok-{i}", [1], True) for i in range(8)] + [
        _small("absorbed", [], False),
        _small("missed", [], True),
    ]
    assert main(["--from-json", str(_saved(tmp_path, outcomes))]) == 0
    text = capsys.readouterr().out
    assert (
        "Without the jobs whose label the truth contradicts: targets missed: cpu_truth: overall rank recall"
        in text
    )
