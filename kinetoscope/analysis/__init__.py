"""Analyses over loaded traces (``kinetoscope.trace.Trace``), one module per analysis.

Each module's docstring holds its definition; every analysis takes a ``Trace`` or a sequence of
Traces and returns one Polars DataFrame with a ``rank`` column (durations in µs). The registry
(``kinetoscope.analysis.registry``) names them; ``run_analyses`` runs a selection and
``build_document`` turns the results into the ``kscope analyze --json`` document. The job
diagnosis's keys come from the layer above (``kinetoscope.diagnosis.document``).
"""

from kinetoscope.analysis.runner import AnalysisResults, build_document, run_analyses

__all__ = ["AnalysisResults", "build_document", "run_analyses"]
