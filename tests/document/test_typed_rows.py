"""The straggler tables, the clock offsets and the evidence block decode into typed parts that
carry every column the diagnosis writes (on a real 3-rank CPU job of ``tests/data``), and the
evidence block's older spellings are mapped by the decoder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest

from kinetoscope.diagnosis import diagnose
from kinetoscope.document import decode
from kinetoscope.document.parts import ClockOffset, Evidence
from kinetoscope.document.stragglers import StragglerRankRow, StragglerStepRow
from kinetoscope.trace import load_trace

JOB = Path(__file__).resolve().parents[1] / "data" / "cpu_jobs" / "two_of_three_late"


@pytest.fixture(scope="module")
def written() -> dict[str, Any]:
    d = diagnose([load_trace(p, cache=False) for p in sorted(JOB.glob("rank-*.json.gz"))])
    out: dict[str, Any] = orjson.loads(orjson.dumps(d.to_dict(), option=orjson.OPT_NON_STR_KEYS))
    return out


def _same_rows(typed: list[Any], raw: list[dict[str, Any]]) -> None:
    assert raw, "the job must have rows for the test to mean anything"
    assert msgspec.to_builtins(typed) == raw
    assert [list(r) for r in msgspec.to_builtins(typed)] == [list(r) for r in raw]  # column order


def test_straggler_rows_and_clock_offsets_are_typed_with_every_written_column(written):
    doc = decode(written)
    assert doc.stragglers is not None and doc.job is not None and doc.job.clock is not None
    assert all(isinstance(r, StragglerRankRow) for r in doc.stragglers.per_rank)
    assert all(isinstance(r, StragglerStepRow) for r in doc.stragglers.per_step)
    assert all(isinstance(o, ClockOffset) for o in doc.job.clock.offsets)
    _same_rows(doc.stragglers.per_rank, written["stragglers"]["per_rank"])
    _same_rows(doc.stragglers.per_step, written["stragglers"]["per_step"])
    _same_rows(doc.job.clock.offsets, written["job"]["clock"]["offsets"])


def test_the_evidence_part_has_every_field_the_diagnosis_writes(written):
    ev = decode(written).evidence
    assert isinstance(ev, Evidence)
    assert list(msgspec.to_builtins(ev)) == list(written["evidence"])
    assert ev.usable is written["evidence"]["usable"] and ev.lines == written["evidence"]["lines"]


@pytest.mark.parametrize(
    ("block", "want"),
    [
        ({"cross_rank_usable": False, "why": ["a", "b"]}, {"usable": False, "reason": "a; b"}),
        (
            {"judgement": "Not-usable: too short", "not_usable_reason": " short "},
            {"usable": False, "reason": "short"},
        ),
        ({"verdict": "usable", "usable": "yes"}, {"usable": True}),
        (
            {"timestamp_anomalies": {"kernel_before_launch": 3, "negative_queue": 1}},
            {"timestamp_anomalies": 4},
        ),
        ({"timestamp_anomalies": [{"count": 2}, {"count": 3}, "x"]}, {"timestamp_anomalies": 6}),
        ({"timestamp_anomalies": {"total": 7, "kernel": 2}}, {"timestamp_anomalies": 7}),
        ({"aligned": False, "steps_in_common": 4.0}, {"windows_aligned": False, "steps_in_common": 4}),
        ({"steps_in_common": "many"}, {"steps_in_common": None, "usable": None, "timestamp_anomalies": None}),
    ],
)
def test_older_evidence_spellings_are_mapped_by_the_decoder(block, want):
    doc = decode({"evidence": block})
    assert doc.problems == [] and doc.evidence is not None
    assert {k: getattr(doc.evidence, k) for k in want} == want
    assert doc.objects["evidence"] == block  # the display form stays as written
