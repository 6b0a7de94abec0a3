"""The Flight Recorder reader (kinetoscope.diagnosis.flight_recorder) on dumps in PyTorch's JSON
form (the fields ``_dump_fr_trace_json`` writes; the real dumps of a hung gloo job are checked in
test_stacks_real.py), and its refusals: a pickle is never unpickled, bad files are named."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from kinetoscope.diagnosis.flight_recorder import FlightRecorderError, analyse
from tests.stacks.conftest import kscope


def _entry(
    seq: int, name: str, pg: str = "0", desc: str = "default_pg", *, done: bool = True
) -> dict[str, Any]:
    return {
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "is_p2p": False,
        "op_id": seq,
        "pg_id": int(pg),
        "process_group": [pg, desc],
        "profiling_name": name,
        "state": "completed" if done else "started",
        "retired": done,
        "time_created_ns": 1,
    }


def _dump(path: Path, entries: list[dict[str, Any]], groups: dict[str, list[int]]) -> None:
    doc = {
        "version": "2.10",
        "comm_lib_version": "2.27.5",
        "pg_config": {g: {"name": g, "desc": "", "ranks": json.dumps(r)} for g, r in groups.items()},
        "pg_status": {},
        "entries": entries,
    }
    path.write_text(json.dumps(doc), encoding="utf-8")


def test_names_the_rank_that_never_entered(tmp_path: Path) -> None:
    groups = {"0": [0, 1, 2, 3], "1": [0, 1]}
    for r in range(4):
        entries = [_entry(s, "nccl:all_reduce") for s in range(1, 30)]
        if r != 1:
            entries.append(_entry(30, "nccl:all_reduce", done=False))
        if r in (0, 1):
            entries.append(_entry(1, "nccl:broadcast", pg="1", desc="tp"))  # finished everywhere: fine
        _dump(tmp_path / f"nccl_trace_rank_{r}", entries, groups)
    report = analyse([tmp_path])
    assert report.ranks == [0, 1, 2, 3] and report.culprits == [1]
    [g] = report.groups
    assert (g.process_group, g.seq, g.collective, g.waiting) == ("0", 30, "nccl:all_reduce", [0, 2, 3])
    assert [(m.rank, m.last_seq) for m in g.never_entered] == [(1, 29)]
    assert "rank 1 never entered it" in g.summary and "default_pg" in g.summary


def test_all_finished_is_no_finding(tmp_path: Path) -> None:
    for r in range(2):
        _dump(tmp_path / f"fr_{r}.json", [_entry(s, "gloo:all_reduce") for s in (1, 2)], {"0": [0, 1]})
    report = analyse([tmp_path])
    assert report.groups == [] and report.culprits == []
    assert "every rank reached the same last collective" in report.verdict


def test_a_missing_dump_is_named(tmp_path: Path) -> None:
    for r in (0, 1):
        _dump(tmp_path / f"fr_{r}.json", [_entry(5, "gloo:all_reduce", done=False)], {"0": [0, 1, 2]})
    [g] = analyse([tmp_path]).groups
    assert g.no_dump == [2] and "no dump from rank 2" in g.summary


def test_pickle_is_refused_never_loaded(tmp_path: Path) -> None:
    bad = tmp_path / "nccl_trace_rank_0"
    bad.write_bytes(pickle.dumps({"entries": []}))
    with pytest.raises(FlightRecorderError, match="pickle.*never unpickles"):
        analyse([bad])
    res = kscope("analyze", "--flight-recorder", str(bad))
    assert res.returncode != 0 and "never unpickles" in res.stderr and "Traceback" not in res.stderr


def test_bad_inputs_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "notjson_3").write_text("{", encoding="utf-8")
    with pytest.raises(FlightRecorderError, match="notjson_3 is not JSON"):
        analyse([tmp_path])
    with pytest.raises(FlightRecorderError, match="no such file"):
        analyse([tmp_path / "absent"])
    nameless = tmp_path / "x" / "dump.json"
    nameless.parent.mkdir()
    _dump(nameless, [], {"0": [0]})
    with pytest.raises(FlightRecorderError, match="no 'rank' field"):
        analyse([nameless])


REAL_NCCL = Path(__file__).resolve().parents[1] / "data" / "flight_recorder" / "nccl_h200_rank0.json"


def test_a_real_nccl_dump_reads_as_finished() -> None:
    """A real NCCL Flight Recorder dump (one rank on an H200, torch 2.11+cu130, NCCL 2.28.9,
    written by ``benchmarks/device/fr_nccl.py``): the reader finds its six collectives and,
    every one completed, no rank that failed to enter."""
    doc = json.loads(REAL_NCCL.read_bytes())
    assert doc["comm_lib_version"].startswith("2.28")
    assert {e["profiling_name"] for e in doc["entries"]} == {"nccl:all_reduce", "nccl:broadcast"}
    report = analyse([REAL_NCCL])
    assert report.ranks == [0]
    assert report.culprits == []
    assert "every rank reached the same last collective" in report.verdict
