"""The one decoder: the JSON/dict form of the analysis document -> ``AnalysisDocument``.

This is the only place that reads the document as a dict. It is tolerant, because documents
come from older versions (the catalog keeps them) and from other producers: unknown keys are
ignored, a missing key leaves its part ``None``, and a part of another shape (or a field of the
wrong type) leaves that part ``None`` and says so in ``problems`` instead of failing the view.
A table row of another shape is dropped from the typed rows (it stays in ``tables``). Every
list-valued key is also kept as row objects (``tables``) and every object-valued key as a dict
(``objects``): the display form, for views that show a part as a table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec
import orjson

from kinetoscope.document.analyses import (
    IdleRow,
    KernelRow,
    KernelTypeRow,
    OverlapRow,
    StepDurationRow,
    TemporalRow,
)
from kinetoscope.document.model import AnalysisDocument
from kinetoscope.document.parts import (
    Evidence,
    Job,
    Mfu,
    Pipeline,
    Recommendation,
    Recompilation,
    StepRow,
    TraceMeta,
    UnevenInputs,
)
from kinetoscope.document.stragglers import Stragglers

T = TypeVar("T")

# Object-valued parts: key -> the Struct of its read form.
OBJECT_PARTS: dict[str, type[msgspec.Struct]] = {
    "job": Job,
    "stragglers": Stragglers,
    "mfu": Mfu,
    "pipeline": Pipeline,
    "uneven_inputs": UnevenInputs,
    "evidence": Evidence,
    "recompilation": Recompilation,
}
# List-valued parts: key -> the Struct of one row.
ROW_PARTS: dict[str, type[msgspec.Struct]] = {
    "traces": TraceMeta,
    "steps": StepRow,
    "recommendations": Recommendation,
    "step_durations": StepDurationRow,
    "temporal_breakdown": TemporalRow,
    "temporal_breakdown_by_step": TemporalRow,
    "idle_time_breakdown": IdleRow,
    "kernel_type_breakdown": KernelTypeRow,
    "kernel_breakdown": KernelRow,
    "kernel_distribution": KernelRow,
    "comm_comp_overlap": OverlapRow,
}


def _json_form(value: Any) -> Any:
    """``value`` as the JSON reader would see it (string keys, NaN as null): a part built in
    this process (``Diagnosis.to_dict``) decodes exactly as one read back from the catalog."""
    return orjson.loads(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS, default=str))


def _convert(value: Any, typ: type[T]) -> T:
    return msgspec.convert(value, typ, strict=False)


def _object_part(key: str, value: Any, problems: list[str]) -> msgspec.Struct | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        problems.append(f"{key}: not an object ({type(value).__name__})")
        return None
    try:
        return _convert(_json_form(value), OBJECT_PARTS[key])
    except (msgspec.ValidationError, orjson.JSONEncodeError) as exc:
        problems.append(f"{key}: {exc}")
        return None


def _row_part(key: str, value: Any, problems: list[str]) -> list[Any] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        problems.append(f"{key}: not a list ({type(value).__name__})")
        return None
    typ = ROW_PARTS[key]
    out, bad = [], 0
    for row in value:
        try:
            out.append(_convert(row, typ) if isinstance(row, Mapping) else None)
        except msgspec.ValidationError:
            out.append(None)
        if out[-1] is None:
            out.pop()
            bad += 1
    if bad:
        problems.append(f"{key}: {bad} row(s) of another shape left out")
    return out


def _text_map(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


def _summary_lines(value: Any) -> list[str] | None:
    return [str(s) for s in value] if isinstance(value, list) else None


def decode(doc: Mapping[str, Any]) -> AnalysisDocument:
    """The typed form of an analysis document (module docstring: what is tolerated)."""
    if not isinstance(doc, Mapping):
        raise TypeError("the analysis document must be a JSON object")
    problems: list[str] = []
    parts: dict[str, Any] = {}
    tables: dict[str, list[dict[str, Any]]] = {}
    objects: dict[str, dict[str, Any]] = {}
    for key, value in doc.items():
        if isinstance(value, list) and key != "diagnosis_summary":
            tables[key] = [dict(r) for r in value if isinstance(r, Mapping)]
        elif isinstance(value, Mapping) and key not in ("notes", "errors"):
            objects[key] = dict(value)
        if key in OBJECT_PARTS:
            parts[key] = _object_part(key, value, problems)
        elif key in ROW_PARTS:
            parts[key] = _row_part(key, value, problems)
    return AnalysisDocument(
        traces=parts.pop("traces", None) or [],
        **parts,
        summary_lines=_summary_lines(doc["diagnosis_summary"] if "diagnosis_summary" in doc else None),
        tables=tables,
        objects=objects,
        keys=[str(k) for k in doc],
        notes=_text_map(doc["notes"] if "notes" in doc else None),
        errors=_text_map(doc["errors"] if "errors" in doc else None),
        problems=problems,
    )


def as_document(doc: AnalysisDocument | Mapping[str, Any]) -> AnalysisDocument:
    """``doc`` typed: as is when it already is, else decoded (a view's entry point takes either)."""
    return doc if isinstance(doc, AnalysisDocument) else decode(doc)
