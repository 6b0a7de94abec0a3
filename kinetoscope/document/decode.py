"""The one decoder: the JSON/dict form of the analysis document -> ``AnalysisDocument``.

This is the only place that reads the document as a dict. It is tolerant, because documents
come from older versions (the catalog keeps them) and from other producers: unknown keys are
ignored, a missing key leaves its part ``None``, and a part of another shape (or a field of the
wrong type) leaves that part ``None`` and says so in ``problems`` instead of failing the view.
A table row of another shape is dropped from the typed rows (it stays in ``tables``). A part
written under older or other producers' spellings is mapped onto its Struct's names first
(``document.spellings``). Every
list-valued key is also kept as row objects (``tables``) and every object-valued key as a dict
(``objects``): the display form, for views that show a part as a table.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec
import orjson

from kinetoscope.document.model import AnalysisDocument
from kinetoscope.document.spellings import PREPARE
from kinetoscope.document.stacks import StackGroupPart, StacksDocument

T = TypeVar("T")


def _struct(t: Any) -> type[msgspec.Struct] | None:
    return t if isinstance(t, type) and issubclass(t, msgspec.Struct) else None


def _part_types() -> tuple[dict[str, type[msgspec.Struct]], dict[str, type[msgspec.Struct]]]:
    """The document keys ``AnalysisDocument`` types, from its fields: ``X | None`` with ``X`` a
    Struct is an object part, ``list[X]`` (or ``list[X] | None``) a row part. Adding a part is
    adding one field there."""
    objects: dict[str, type[msgspec.Struct]] = {}
    rows: dict[str, type[msgspec.Struct]] = {}
    for f in msgspec.structs.fields(AnalysisDocument):
        union = isinstance(f.type, types.UnionType) or typing.get_origin(f.type) is typing.Union
        for t in typing.get_args(f.type) if union else (f.type,):
            if (obj := _struct(t)) is not None:
                objects[f.encode_name] = obj
            elif typing.get_origin(t) is list and (row := _struct(typing.get_args(t)[0])) is not None:
                rows[f.encode_name] = row
    return objects, rows


# Object-valued parts (key -> the Struct of its read form) and list-valued ones (key -> the
# Struct of one row), derived from ``AnalysisDocument``.
OBJECT_PARTS, ROW_PARTS = _part_types()


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
        form = _json_form(value)
        return _convert(PREPARE[key](form) if key in PREPARE else form, OBJECT_PARTS[key])
    except (msgspec.ValidationError, orjson.JSONEncodeError) as exc:
        problems.append(f"{key}: {exc}")
        return None


def _row_part(key: str, value: Any, problems: list[str], typ: type[T] | None = None) -> list[T] | None:
    """The typed rows of a list-valued key (``typ``, default ``ROW_PARTS[key]``); a row of
    another shape is left out and counted in ``problems``."""
    if value is None:
        return None
    if not isinstance(value, list):
        problems.append(f"{key}: not a list ({type(value).__name__})")
        return None
    row_type: Any = typ if typ is not None else ROW_PARTS[key]
    out: list[Any] = []
    bad = 0
    for row in value:
        try:
            out.append(_convert(row, row_type) if isinstance(row, Mapping) else None)
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


def decode_stacks(doc: Mapping[str, Any]) -> StacksDocument:
    """The typed form of a ``kscope stacks --json`` document (``document.stacks``): tolerant as
    ``decode`` (a group of another shape is left out and named in ``problems``)."""
    if not isinstance(doc, Mapping):
        raise TypeError("the stacks document must be a JSON object")
    problems: list[str] = []
    groups = _row_part("groups", doc["groups"] if "groups" in doc else None, problems, StackGroupPart)
    outliers = doc["outliers"] if "outliers" in doc else None
    verdict = doc["verdict"] if "verdict" in doc else None
    return StacksDocument(
        groups=groups or [],
        outliers=[r if isinstance(r, int) else None for r in outliers] if isinstance(outliers, list) else [],
        verdict=str(verdict) if verdict is not None else None,
        problems=problems,
    )
