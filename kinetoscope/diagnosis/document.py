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
from kinetoscope.trace.model import Trace


def run_diagnosis(traces: Sequence[Trace], results: AnalysisResults, **options: Any) -> dict[str, Any]:
    """The diagnosis keys of the document: ``diagnose(traces, results, **options)`` as a dict.

    The keys are among ``protocol.document_keys.ALL_DIAGNOSIS_KEYS`` ("job", "steps", "stragglers", "mfu",
    "recommendations"), each a JSON-ready value or a ``pl.DataFrame`` (``build_document`` turns
    it into row objects), plus ``"summary"``: the lines the CLI prints first in human output
    (kept in the JSON under ``diagnosis_summary``). ``options`` (``model_flops``,
    ``peak_flops``, ...) go to ``diagnose``. A diagnosis failure must not hide the analyses: it
    is recorded under ``results.errors["diagnosis"]`` and this returns ``{}``.
    """
    try:
        # looked up at call time, so a test (or a plug-in) can replace diagnose
        out = _diagnosis.diagnose(list(traces), results, **options)
        # a Diagnosis gives its JSON form in one go (as a Mapping it is the same, key by key)
        to_dict = getattr(out, "to_dict", None)
        return dict(to_dict()) if callable(to_dict) else dict(out or {})
    except Exception as exc:  # noqa: BLE001 - a diagnosis failure must not hide the analyses
        results.errors["diagnosis"] = f"{type(exc).__name__}: {exc}"
        return {}
