"""The diagnosis's parts come from one ordered list of builders, each returning the typed part
the views decode: on a real 3-rank CPU job of ``tests/data``, and on the producers of the
optional parts (uneven inputs, recompilation, MFU) whose JSON must stay what it was."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from kinetoscope.analysis.runner import AnalysisResults
from kinetoscope.diagnosis import builders, diagnose
from kinetoscope.diagnosis.document import run_diagnosis
from kinetoscope.diagnosis.mfu import MFUResult
from kinetoscope.diagnosis.recompile import recompilation_summary
from kinetoscope.diagnosis.result import Diagnosis
from kinetoscope.diagnosis.uneven import UnevenReport
from kinetoscope.document import AnalysisDocument, decode, parts
from kinetoscope.document.decode import OBJECT_PARTS, ROW_PARTS
from kinetoscope.protocol.document_keys import ALL_DIAGNOSIS_KEYS
from kinetoscope.trace import load_trace

JOB = Path(__file__).resolve().parents[1] / "data" / "cpu_jobs" / "two_of_three_late"


@pytest.fixture(scope="module")
def diagnosis() -> Diagnosis:
    return diagnose([load_trace(p, cache=False) for p in sorted(JOB.glob("rank-*.json.gz"))])


def test_the_builders_are_the_summary_then_the_key_list_in_order():
    assert [b.key for b in builders.BUILDERS] == ["summary", *ALL_DIAGNOSIS_KEYS]


def test_the_document_is_the_builders_parts_in_their_order(diagnosis):
    doc = diagnosis.to_dict()
    assert list(doc) == [b.key for b in builders.BUILDERS] == list(diagnosis)
    ctx = builders.DiagnosisContext(diagnosis)
    for b in builders.BUILDERS:
        assert builders.encode(b.build(ctx)) == doc[b.key], b.key
    # each builder sees the parts built before it
    seen: list[list[str]] = []

    def spy(c: builders.DiagnosisContext) -> None:
        seen.append(list(c.parts))

    ctx = builders.DiagnosisContext(diagnosis)
    out = builders.build_parts(ctx, (*builders.BUILDERS[:2], builders.PartBuilder("probe", spy)))
    assert seen == [["summary", "job"]] and out["probe"] is None and ctx.parts is out


def test_a_typed_part_reads_back_as_the_struct_it_was_built_as(diagnosis):
    """The written and the read form are one Struct: decoding the encoded part gives it back."""
    ctx = builders.DiagnosisContext(diagnosis)
    job = builders.job_part(ctx)
    mfu = builders.mfu_part(ctx)
    recs = builders.recommendations_part(ctx)
    assert isinstance(job, parts.Job) and job.rank_sources and job.collective_signal == ["backend_annotation"]
    d = decode(
        {"job": builders.encode(job), "mfu": builders.encode(mfu), "recommendations": builders.encode(recs)}
    )
    assert d.problems == [] and d.job == job and d.mfu == mfu and d.recommendations == recs
    assert recs and recs[0].evidence  # a real job's straggler recommendation, with its numbers


def test_run_diagnosis_builds_the_document_once_through_the_list(monkeypatch):
    calls: list[int] = []
    real = builders.build_parts

    def counting(ctx, order=builders.BUILDERS):
        calls.append(1)
        assert ctx.traces and ctx.options == {"model_flops": 1e12}
        return real(ctx, order)

    monkeypatch.setattr(builders, "build_parts", counting)
    traces = [load_trace(p, cache=False) for p in sorted(JOB.glob("rank-*.json.gz"))]
    res = AnalysisResults()
    diag = run_diagnosis(traces, res, model_flops=1e12)
    assert calls == [1] and not res.errors and list(diag) == ["summary", *ALL_DIAGNOSIS_KEYS]
    assert diag["mfu"]["flops_source"] == "model_flops"


def _same(part: msgspec.Struct, json_form: dict) -> None:
    """The part encodes to the producer's JSON form, key for key and in its order."""
    got = builders.encode(part)
    assert list(got) == list(json_form) and got == json_form


def test_the_optional_parts_encode_exactly_as_their_producers_wrote_them():
    uneven = UnevenReport(
        mode="join",
        short_ranks=[1],
        waiting_ranks=[0, 2],
        steps_per_rank={0: 6, 1: 3, 2: 6},
        collectives_per_rank={0: 12, 1: 6, 2: 12},
        shadow_collectives={1: 2},
        idle_ms={1: 310.25},
        lost_fraction=0.31234,
        unmatched=None,
    ).to_dict()
    _same(parts.UnevenInputs(**uneven), uneven)
    events = [
        {"rank": 0, "step": None, "recompile": False, "duration_ms": 1200.0},
        {"rank": 0, "step": 4, "recompile": True, "duration_ms": 80.5},
    ]
    recompilation = recompilation_summary(events)
    assert recompilation is not None
    _same(parts.Recompilation(**recompilation), recompilation)
    mfu = MFUResult(
        mfu=0.41, flops_per_step=1e15, flops_source="model_flops", chips=8, assumptions=["x"]
    ).to_dict()
    _same(parts.Mfu(**mfu), mfu)
    # a key the part's Struct does not name fails the build, instead of leaving the JSON
    with pytest.raises(TypeError):
        parts.UnevenInputs(**uneven, new_measurement=1.0)


def test_the_decoder_takes_its_part_types_from_the_document_struct():
    """``OBJECT_PARTS``/``ROW_PARTS`` are derived from ``AnalysisDocument``'s fields: every
    Struct-typed field is a part, nothing else is."""
    fields = {f.name: f for f in msgspec.structs.fields(AnalysisDocument)}
    assert set(OBJECT_PARTS) | set(ROW_PARTS) == {
        "job",
        "stragglers",
        "mfu",
        "pipeline",
        "uneven_inputs",
        "recompilation",
        "evidence",
        "traces",
        "steps",
        "recommendations",
        "step_durations",
        "temporal_breakdown",
        "temporal_breakdown_by_step",
        "idle_time_breakdown",
        "kernel_type_breakdown",
        "kernel_breakdown",
        "kernel_distribution",
        "comm_comp_overlap",
    }
    assert OBJECT_PARTS["stragglers"].__name__ == "Stragglers" and ROW_PARTS["steps"] is parts.StepRow
    assert ROW_PARTS["traces"] is parts.TraceMeta  # a list without "| None" is a row part too
    assert not set(OBJECT_PARTS) & set(ROW_PARTS) and set(OBJECT_PARTS) | set(ROW_PARTS) <= set(fields)
