"""The analysis document, typed: one decoder, one summary, one key list.

Layer: below ``diagnosis`` (whose builders, ``diagnosis/builders.py``, return these parts) and
below the views (``report``, ``web``, ``cli``, ``autopilot``) and the orchestration that records
analyses: the parts are the contract between the diagnosis that writes them and the views. The document itself stays
the JSON object ``kscope analyze --json`` prints (docs/analysis.md); this package is how code
reads it:

    from kinetoscope.document import decode, summarize
    doc = decode(json_document)           # AnalysisDocument: typed parts, None when absent
    doc.stragglers.kind, doc.mfu.mfu      # no dict reads in the views
    summarize(doc).catalog_fields()       # the catalog's listing fields

``decode`` is the only place that reads the document as a dict (``decode.py``).
"""

from __future__ import annotations

from kinetoscope.document.decode import as_document, decode
from kinetoscope.document.model import DIAGNOSIS_KEYS, DOCUMENT_KEYS, EXTRA_DIAGNOSIS_KEYS, AnalysisDocument
from kinetoscope.document.summary import Summary, summarize

__all__ = [
    "DIAGNOSIS_KEYS",
    "DOCUMENT_KEYS",
    "EXTRA_DIAGNOSIS_KEYS",
    "AnalysisDocument",
    "as_document",
    "Summary",
    "decode",
    "summarize",
]
