"""The diagnosis's keys of the analysis document, built by an ordered list of part builders.

Terms: a *part* is the value of one document key (``docs/analysis.md``, ``docs/diagnosis.md``);
a *builder* (``PartBuilder``) pairs a key with the function that makes its part from one
``DiagnosisContext``: what ``diagnose`` computed, the traces, the analyses' results, the
diagnosis options and the parts built before it (in ``BUILDERS`` order). ``build_parts`` runs
the list in order and encodes each part with ``msgspec.to_builtins``: the dict that
``Diagnosis.to_dict`` returns and ``run_diagnosis`` hands to ``runner.build_document``.

Why a list: like the analysis registry and the ``RULES`` list of ``recommendations.py``, adding a
key is one entry here, and the document's key order is the list's. A builder returns the typed
part of ``kinetoscope.document`` (the same Struct the views decode), so the written and the read
form cannot drift: a producer key the Struct lacks fails at build time (``TypeError``), and the
JSON keeps the order and values it always had. Three parts are still their producer's JSON form:
``steps`` (a table: the breakdown's columns, read as ``document.StepRow``), ``stragglers`` and
``pipeline`` (their producers' dicts, whose shape the read Structs name only in part) and
``evidence`` (``evidence.Evidence``, a Struct of its own, plus the computed lines).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import polars as pl

from kinetoscope.analysis.runner import frame_rows
from kinetoscope.diagnosis.assembly import Job
from kinetoscope.diagnosis.clock import ClockAlignment
from kinetoscope.diagnosis.evidence import Evidence
from kinetoscope.diagnosis.mfu import MFUResult
from kinetoscope.diagnosis.stragglers.model import StragglerReport
from kinetoscope.document import parts
from kinetoscope.protocol.document_keys import DIAGNOSIS_KEYS, EXTRA_DIAGNOSIS_KEYS
from kinetoscope.trace.model import Trace

JOB, STEPS, STRAGGLERS, MFU, RECOMMENDATIONS = DIAGNOSIS_KEYS
PIPELINE, UNEVEN_INPUTS, RECOMPILATION, EVIDENCE = EXTRA_DIAGNOSIS_KEYS
SUMMARY = "summary"  # the summary lines; ``build_document`` writes them as ``diagnosis_summary``


class Diagnosed(Protocol):
    """What ``diagnose`` computed (``result.Diagnosis``): the builders' input. The optional
    analyses (``pipeline``, ``uneven_inputs``, ``recompilation``) are their JSON form, as the
    recommendation rules read them, ``None`` when the job does not show the problem."""

    job: Job
    clock: ClockAlignment
    steps: pl.DataFrame
    collectives: pl.DataFrame
    stragglers: StragglerReport
    mfu: MFUResult
    recommendations: list[dict[str, Any]]
    step_source: str | None
    other_jobs: list[dict[str, Any]]
    notes: list[str]
    evidence: Evidence | None
    pipeline: dict[str, Any] | None
    uneven_inputs: dict[str, Any] | None
    recompilation: dict[str, Any] | None

    def summary(self) -> list[str]: ...


@dataclass
class DiagnosisContext:
    """One builder's input: the diagnosis, what it was computed from, and ``parts``: the JSON
    form of the parts built so far, by key (a builder may read an earlier one)."""

    diagnosis: Diagnosed
    traces: Sequence[Trace] = ()
    results: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    parts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PartBuilder:
    """One document key and the function that builds its part (``None``: the key is ``null``)."""

    key: str
    build: Callable[[DiagnosisContext], Any]


def summary_part(ctx: DiagnosisContext) -> list[str]:
    """The verdict, job, MFU and top recommendations as lines (``Diagnosis.summary``)."""
    return list(ctx.diagnosis.summary())


def _clock(clock: ClockAlignment) -> parts.Clock:
    return parts.Clock(
        reference_rank=clock.reference,
        match_method=clock.match_method,
        window_us=clock.window_ns / 1000.0,
        residual_us=clock.residual_us(),
        offsets=[parts.ClockOffset(**r) for r in frame_rows(clock.table)],
        notes=list(clock.notes),
    )


def job_part(ctx: DiagnosisContext) -> parts.Job:
    """Which ranks were found, steps, devices, backends, clocks and the other jobs."""
    d = ctx.diagnosis
    traces = d.job.traces.values()
    base = d.job.to_dict()
    base["notes"] = base["notes"] + list(d.notes)
    return parts.Job(
        **base,
        steps_found=int(d.steps["step"].n_unique()) if d.steps.height else 0,
        step_source=d.step_source,
        device_types=sorted({t.meta.device_type for t in traces}),
        backends=sorted(
            {
                str(t.meta.distributed_info["backend"])
                for t in traces
                if t.meta.distributed_info.get("backend")
            }
        ),
        collective_signal=(
            sorted(set(d.collectives["signal"].to_list())) if "signal" in d.collectives.columns else []
        ),
        clock=_clock(d.clock),
        other_jobs=[parts.OtherJob(**o) for o in d.other_jobs],
    )


def steps_part(ctx: DiagnosisContext) -> list[dict[str, Any]]:
    """The per-rank, per-step breakdown as row objects (its columns: ``document.StepRow``)."""
    return frame_rows(ctx.diagnosis.steps)


def stragglers_part(ctx: DiagnosisContext) -> dict[str, Any]:
    """The straggler verdict (``StragglerReport.to_dict``, docs/diagnosis.md §8)."""
    return ctx.diagnosis.stragglers.to_dict()


def mfu_part(ctx: DiagnosisContext) -> parts.Mfu:
    """Model FLOPs utilisation and what it rests on."""
    return parts.Mfu(**ctx.diagnosis.mfu.to_dict())


def recommendations_part(ctx: DiagnosisContext) -> list[parts.Recommendation]:
    """The recommendations, most severe first, each with the numbers that triggered it."""
    return [parts.Recommendation(**r) for r in ctx.diagnosis.recommendations]


def pipeline_part(ctx: DiagnosisContext) -> dict[str, Any] | None:
    """The pipeline-parallel analysis (``PipelineReport.to_dict``), None without a pipeline."""
    return ctx.diagnosis.pipeline


def uneven_part(ctx: DiagnosisContext) -> parts.UnevenInputs | None:
    """Ranks that ran out of data first, None when every rank ran alike."""
    u = ctx.diagnosis.uneven_inputs
    return parts.UnevenInputs(**u) if u else None


def recompilation_part(ctx: DiagnosisContext) -> parts.Recompilation | None:
    """torch.compile compilations inside the window, None when nothing was compiled."""
    r = ctx.diagnosis.recompilation
    return parts.Recompilation(**r) if r else None


def evidence_part(ctx: DiagnosisContext) -> dict[str, Any] | None:
    """What the verdict rests on (``evidence.Evidence.to_dict``)."""
    ev = ctx.diagnosis.evidence
    return ev.to_dict() if ev is not None else None


# The diagnosis's keys, in document order: the summary, then ``protocol.document_keys``'s.
BUILDERS: tuple[PartBuilder, ...] = (
    PartBuilder(SUMMARY, summary_part),
    PartBuilder(JOB, job_part),
    PartBuilder(STEPS, steps_part),
    PartBuilder(STRAGGLERS, stragglers_part),
    PartBuilder(MFU, mfu_part),
    PartBuilder(RECOMMENDATIONS, recommendations_part),
    PartBuilder(PIPELINE, pipeline_part),
    PartBuilder(UNEVEN_INPUTS, uneven_part),
    PartBuilder(RECOMPILATION, recompilation_part),
    PartBuilder(EVIDENCE, evidence_part),
)


def encode(part: Any) -> Any:
    """A part's JSON-ready form (Structs to dicts in field order; other values as they are)."""
    return msgspec.to_builtins(part, enc_hook=_scalar)


def _scalar(value: Any) -> Any:
    """A NumPy scalar (a Polars/NumPy reduction that reached a producer's dict) as Python's."""
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"a document part holds a {type(value).__name__}, which JSON cannot carry")


def build_parts(ctx: DiagnosisContext, builders: Sequence[PartBuilder] = BUILDERS) -> dict[str, Any]:
    """Every builder's part, in order, encoded (module docstring); also left in ``ctx.parts``."""
    for b in builders:
        ctx.parts[b.key] = encode(b.build(ctx))
    return ctx.parts
