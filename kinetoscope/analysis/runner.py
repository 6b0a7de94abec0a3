"""Run registered analyses over loaded traces and build the ``kscope analyze --json`` document.

The CLI, the HTML report and the web app all go through here; they differ only in rendering.

* ``run_analyses(traces, names=None, options=None) -> AnalysisResults`` (a ``dict`` name ->
  ``pl.DataFrame``, plus ``notes`` for analyses that had nothing to work on and ``errors``).
* ``build_document(traces, results, diagnosis=...) -> dict`` (JSON-ready: one key per analysis
  holding a list of row objects, ``traces``, ``notes``, ``errors`` and the job-level diagnosis
  keys it is given).

The diagnosis sits above the analyses and is never imported from here:
:func:`kinetoscope.diagnosis.document.run_diagnosis` computes its keys and callers pass them to
``build_document``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import polars as pl

from kinetoscope.analysis import registry
from kinetoscope.analysis._common import as_traces, device_frame
from kinetoscope.trace.model import Trace

NO_GPU_NOTE = "no GPU events"

# The diagnosis' own keys are listed by the diagnosis (``kinetoscope.protocol.document_keys``).


class AnalysisResults(dict[str, pl.DataFrame]):
    """Results by analysis name, in run order. ``notes[name]`` says why a result is empty
    (e.g. "no GPU events"); ``errors[name]`` holds the message of an analysis that failed."""

    def __init__(self) -> None:
        super().__init__()
        self.notes: dict[str, str] = {}
        self.errors: dict[str, str] = {}


def has_device_events(traces: Sequence[Trace]) -> bool:
    return any(device_frame(t).height > 0 for t in traces)


def resolve_names(names: Sequence[str] | None) -> list[str]:
    """Requested names (validated, de-duplicated, in display order), or the defaults."""
    if not names:
        return registry.default_names()
    wanted = []
    for n in names:
        registry.get(n)  # raises KeyError with the list of known names
        if n not in wanted:
            wanted.append(n)
    order = {s.name: i for i, s in enumerate(registry.all_specs())}
    return sorted(wanted, key=lambda n: order[n])


def run_analyses(
    traces: Trace | Sequence[Trace],
    names: Sequence[str] | None = None,
    options: Mapping[str, Any] | None = None,
    *,
    raise_errors: bool = False,
) -> AnalysisResults:
    """Run the named analyses (default: every analysis registered with ``default=True``).

    ``options`` is one flat mapping; each analysis takes the keys it declares
    (``registry.AnalysisSpec.options``), e.g. ``{"num_kernels": 20,
    "consecutive_kernel_delay_us": 10}``. An analysis that needs GPU events is skipped with the
    note "no GPU events" when no trace has any. A failing analysis is recorded in ``errors``
    (or re-raised with ``raise_errors``) and the others still run.
    """
    tl = as_traces(traces)
    return collect_results(
        names, has_device_events(tl), lambda spec: spec.call(tl, options), raise_errors=raise_errors
    )


class AnalysisFailure(Exception):
    """Raised by a ``collect_results`` callback with a message that is already the one to
    record (e.g. a worker's, in ``kinetoscope.scale``)."""


def collect_results(
    names: Sequence[str] | None,
    gpu: bool,
    compute: Callable[[registry.AnalysisSpec], pl.DataFrame],
    *,
    raise_errors: bool = False,
) -> AnalysisResults:
    """The loop every way of running analyses shares: in display order, an analysis that needs
    GPU events is skipped with a note when there are none (``gpu``), ``compute(spec)`` gives its
    frame, a failure is recorded in ``errors`` (the others still run), an empty result gets the
    analysis's ``empty_note``."""
    results = AnalysisResults()
    for name in resolve_names(names):
        spec = registry.get(name)
        if spec.needs_gpu and not gpu:
            results[name] = pl.DataFrame()
            results.notes[name] = NO_GPU_NOTE
            continue
        try:
            df = compute(spec)
        except Exception as exc:  # noqa: BLE001 - reported per analysis, the rest still run
            if raise_errors:
                raise
            results[name] = pl.DataFrame()
            results.errors[name] = (
                str(exc) if isinstance(exc, AnalysisFailure) else f"{type(exc).__name__}: {exc}"
            )
            continue
        results[name] = df
        if df.is_empty() and spec.empty_note:
            results.notes[name] = spec.empty_note
    return results


def _json_value(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def frame_rows(df: pl.DataFrame) -> list[dict[str, Any]]:
    """A DataFrame as a list of JSON-ready row objects (NaN/inf become null)."""
    if df.is_empty():
        return []
    floats = [c for c, t in df.schema.items() if t.is_float()]
    if floats:
        df = df.with_columns(
            [pl.when(pl.col(c).is_finite()).then(pl.col(c)).otherwise(None).alias(c) for c in floats]
        )
    return df.to_dicts()


def build_document(
    traces: Trace | Sequence[Trace],
    results: AnalysisResults,
    *,
    diagnosis: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``kscope analyze --json`` document (see docs/analysis.md).

    Key order: ``traces``, the diagnosis keys (when present), one key per analysis in run order,
    ``notes``, ``errors``."""
    tl = as_traces(traces)
    doc: dict[str, Any] = {"traces": [t.meta.to_dict() for t in tl]}
    diag = dict(diagnosis or {})
    summary = diag.pop("summary", None)
    if summary:
        doc["diagnosis_summary"] = list(summary)
    for key, value in diag.items():
        doc[key] = frame_rows(value) if isinstance(value, pl.DataFrame) else value
    for name, df in results.items():
        doc[name] = frame_rows(df)
    doc["notes"] = dict(results.notes)
    doc["errors"] = dict(results.errors)
    return doc
