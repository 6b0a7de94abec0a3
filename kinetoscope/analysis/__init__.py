"""Analyses over loaded traces (``kinetoscope.trace.Trace``), one module per analysis.

Each module's docstring holds its definition; every analysis takes a ``Trace`` or a sequence of
Traces and returns one Polars DataFrame with a ``rank`` column (durations in µs). The registry
(``kinetoscope.analysis.registry``) names them; ``run_analyses`` runs a selection and
``build_document`` turns the results into the ``kscope analyze --json`` document. The job
diagnosis's keys come from the layer above (``kinetoscope.diagnosis.document``).
"""

# Lazy (PEP 562): ``from kinetoscope.analysis import registry`` must not import Polars and the
# trace loader, so that listing the analyses stays cheap (issue 14).
from kinetoscope.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__, {"AnalysisResults": "runner", "build_document": "runner", "run_analyses": "runner"}
)
