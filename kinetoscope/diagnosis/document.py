"""The job diagnosis's part of the ``kscope analyze --json`` document.

Why here and not in :mod:`kinetoscope.analysis.runner`: the diagnosis reads the analyses'
results, so it sits above them; the runner builds the document from what it is given and never
imports the diagnosis (data flows one way: trace -> analyses -> diagnosis). The one way of
producing the document (``kinetoscope.orchestration.analyze``, through the scale-out reduce of
``kinetoscope.scale``) calls :func:`run_diagnosis` and passes its result to
``runner.build_document``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kinetoscope import diagnosis as _diagnosis
from kinetoscope.analysis.runner import AnalysisResults
from kinetoscope.diagnosis import builders
from kinetoscope.diagnosis.result import Diagnosis
from kinetoscope.trace.model import Trace


def run_diagnosis(traces: Sequence[Trace], results: AnalysisResults, **options: Any) -> dict[str, Any]:
    """The diagnosis keys of the document: ``diagnose(traces, results, **options)``, each part
    built by ``builders.BUILDERS`` in order and encoded (``builders.build_parts``).

    The keys are ``"summary"`` (the lines the CLI prints first in human output, kept in the
    JSON under ``diagnosis_summary``) and ``protocol.document_keys.ALL_DIAGNOSIS_KEYS`` ("job",
    "steps", "stragglers", "mfu", "recommendations", "pipeline", ...), each JSON-ready.
    ``options`` (``model_flops``, ``peak_flops``, ...) go to ``diagnose``. A diagnosis failure
    must not hide the analyses: it is recorded under ``results.errors["diagnosis"]`` and this
    returns ``{}``.
    """
    try:
        # looked up at call time, so a test (or a plug-in) can replace diagnose
        out = _diagnosis.diagnose(list(traces), results, **options)
        if not isinstance(out, Diagnosis):  # a plug-in's diagnosis: its keys as they are
            return dict(out or {})
        ctx = builders.DiagnosisContext(out, traces=traces, results=results, options=options)
        return builders.build_parts(ctx)
    except Exception as exc:  # noqa: BLE001 - a diagnosis failure must not hide the analyses
        results.errors["diagnosis"] = f"{type(exc).__name__}: {exc}"
        return {}
