"""The stacks document read typed (``document.decode_stacks``), as the hang alert reads it from
the catalog: a real report of ``collect.stack_groups``, recorded and read back."""

from __future__ import annotations

from pathlib import Path

from kinetoscope.autopilot.hang import alert_details
from kinetoscope.collect.stack_groups import RankStacks, StacksReport, build_report
from kinetoscope.document.decode import decode_stacks
from kinetoscope.protocol import rpc
from kinetoscope.store.catalog import Catalog
from kinetoscope.store.stacks_store import record_stacks


def _frames(fn: str) -> list[rpc.StackFrame]:
    return [
        rpc.StackFrame(name=fn, file="/job/lib.py", short_file="lib.py", line=3, locals=None),
        rpc.StackFrame(name="main", file="/job/train.py", short_file="train.py", line=9, locals=None),
    ]


def _rank(r: int, fn: str) -> RankStacks:
    main = rpc.ThreadStack(
        thread_id=1, os_thread_id=100 + r, name="MainThread", active=False, owns_gil=False, frames=_frames(fn)
    )
    snap = rpc.ProcessStacks(
        pid=100 + r,
        host_pid=100 + r,
        rank=r,
        local_rank=r,
        world_size=4,
        job_id="1",
        cmdline="python train.py",
        threads=[main],
        cpu_s=0.0,
        taken_at=0.0,
    )
    return RankStacks(host="h:1778", hostname="h", pid=100 + r, host_pid=100 + r, rank=r, snapshots=[snap])


def _stacks_report() -> StacksReport:
    ranks = [_rank(r, "load_batch" if r == 2 else "all_reduce") for r in range(4)]
    return build_report(ranks, target={"job_id": 1}, samples=1, interval_s=1.0, hosts=[], errors=[])


def _report() -> dict[str, object]:
    return _stacks_report().to_json()


def test_a_real_stacks_document_decodes_with_its_groups():
    doc = _report()
    s = decode_stacks(doc)
    assert s.problems == [] and s.verdict == doc["verdict"] and s.outliers == [2]
    assert [(g.ranks, g.summary, g.outlier) for g in s.groups] == [
        (g["ranks"], g["summary"], g["outlier"])
        for g in doc["groups"]  # type: ignore[attr-defined]
    ]
    assert any(g.outlier and g.ranks == [2] for g in s.groups)


def test_an_odd_group_is_left_out_and_named():
    doc = {
        "groups": [{"ranks": [0, 1], "summary": "x", "outlier": False}, {"ranks": "all"}, 7],
        "verdict": None,
    }
    s = decode_stacks(doc)
    assert [g.ranks for g in s.groups] == [[0, 1]] and s.verdict is None
    assert s.problems == ["groups: 2 row(s) of another shape left out"]
    assert decode_stacks({}).groups == [] and decode_stacks({"groups": "x"}).problems == [
        "groups: not a list (str)"
    ]


def test_the_hang_alert_reads_the_recorded_groups(tmp_path: Path):
    report = _stacks_report()
    doc = report.to_json()
    with Catalog.open(str(tmp_path / "c.db")) as cat:
        row = record_stacks(cat, report, trigger="hang:cpu", job_key="slurm:1")
        got = alert_details(cat, {"sample_id": row["stacks_id"]})
    assert got["stacks_id"] == row["stacks_id"] and got["outlier_ranks"] == [2]
    # the catalog columns come from the report's typed fields, the document is its JSON whole
    assert row["document"] == doc and (row["ranks"], row["outliers"], row["verdict"]) == (
        4,
        [2],
        doc["verdict"],
    )
    assert row["groups"] == len(report.groups) and row["states"] == doc["states"] and row["hosts"] == []
    assert got["groups"] == [
        {"ranks": g["ranks"], "summary": g["summary"], "outlier": g["outlier"]}
        for g in doc["groups"]  # type: ignore[attr-defined]
    ]
