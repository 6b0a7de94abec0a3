"""The typed document: one decoder (tolerant, the JSON form and the dict form alike), one
summary, one key list — on a real 3-rank CPU job of ``tests/data``."""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import pytest

from kinetoscope.document import DOCUMENT_KEYS, AnalysisDocument, decode, summarize

JOB = Path(__file__).resolve().parents[1] / "data" / "cpu_jobs" / "two_of_three_late"


@pytest.fixture(scope="module")
def doc() -> dict:
    from kinetoscope.orchestration import analyze_paths

    return analyze_paths(sorted(JOB.glob("rank-*.json.gz")), cache=False)


def test_the_real_document_decodes_without_a_problem(doc):
    d = decode(doc)
    assert d.problems == []
    s = doc["stragglers"]
    assert d.stragglers is not None and d.stragglers.kind == s["kind"] and d.stragglers.ranks == s["ranks"]
    assert d.stragglers.what_if is not None
    assert d.stragglers.what_if.mean_step_time_us == s["what_if"]["mean_step_time_us"]
    w = d.stragglers.whatif
    assert w is not None and w.slowdown == s["whatif"]["slowdown"]
    assert [n.rank for n in w.explaining_set] == [n["rank"] for n in s["whatif"]["explaining_set"]]
    assert w.recovered_fraction == s["whatif"]["recovered_fraction"]
    assert d.job is not None and d.job.world_size == 3 and d.job.clock is not None
    assert [r.id for r in d.recommendations or []] == [r["id"] for r in doc["recommendations"]]
    assert len(d.steps or []) == len(doc["steps"])
    assert d.steps and d.steps[0].step_time_us == doc["steps"][0]["step_time(us)"]
    assert d.summary_lines == doc["diagnosis_summary"]
    assert d.mfu is not None and d.mfu.reason == doc["mfu"]["reason"]
    assert d.evidence is not None and d.evidence.lines == doc["evidence"]["lines"]


def test_the_json_form_and_the_dict_form_decode_alike_and_nothing_is_changed(doc):
    before = json.dumps(doc, sort_keys=True)
    assert decode(json.loads(json.dumps(doc))) == decode(doc)
    assert json.dumps(doc, sort_keys=True) == before  # the decoder never writes into the document


def test_unknown_fields_and_new_kinds_read_through(doc):
    odd = copy.deepcopy(doc)
    odd["stragglers"]["kind"] = "mixed"
    odd["stragglers"]["a_field_added_later"] = {"x": 1}
    odd["stragglers"]["whatif"]["another"] = [1, 2]
    odd["a_key_added_later"] = {"y": 2}
    d = decode(odd)
    assert d.problems == [] and d.stragglers is not None and d.stragglers.kind == "mixed"
    assert d.objects["a_key_added_later"] == {"y": 2}


def test_parts_of_another_shape_read_as_absent_and_say_why():
    d = decode(
        {
            "steps": "not a list",
            "stragglers": ["odd"],
            "mfu": 3,
            "recommendations": {"x": 1},
            "job": None,
            "kernel_breakdown": [{"name": None, "sum (us)": "x"}, {"name": "k", "sum (us)": 2.0}],
            "evidence": {"assessed": "maybe"},
        }
    )
    assert (d.steps, d.stragglers, d.mfu, d.recommendations, d.job, d.evidence) == (None,) * 6
    assert [k.name for k in d.kernel_breakdown or []] == ["k"]
    assert len(d.tables["kernel_breakdown"]) == 2  # the rows stay for display
    named = {p.split(":")[0] for p in d.problems}
    assert named == {"steps", "stragglers", "mfu", "recommendations", "kernel_breakdown", "evidence"}
    with pytest.raises(TypeError):
        decode(["not", "a", "document"])  # type: ignore[arg-type]


def test_one_summary(doc):
    s = summarize(doc)
    per_step: dict[int, list[float]] = {}
    for r in doc["steps"]:
        per_step.setdefault(r["step"], []).append(r["step_time(us)"])
    want = statistics.median(statistics.median(v) for v in per_step.values()) / 1000.0
    assert s.step_time_ms == pytest.approx(want)
    assert s.straggler_kind == doc["stragglers"]["kind"] and s.straggler_ranks == doc["stragglers"]["ranks"]
    assert s.world_size == 3 and s.verdict == doc["diagnosis_summary"][0]
    rec = next(r for r in doc["recommendations"] if r["id"].startswith("straggler"))
    assert s.lost_fraction == rec["evidence"]["lost_fraction"]
    assert list(s.catalog_fields()) == [
        "step_time_ms",
        "straggler_kind",
        "straggler_ranks",
        "world_size",
        "verdict",
    ]
    assert summarize(decode(doc)) == s
    assert summarize({}).catalog_fields() == {}
    assert summarize({"traces": [{"world_size": 4}, {"world_size": 4}]}).world_size == 4


def test_one_key_list_names_every_key_of_the_diagnosis(doc):
    from kinetoscope.analysis import registry

    assert set(doc) <= set(DOCUMENT_KEYS) | set(registry.names())
    assert isinstance(decode(doc), AnalysisDocument)
