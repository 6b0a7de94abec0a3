"""The document keys the job diagnosis contributes (the one list; ``kinetoscope.document``
re-exports it with the rest of the document's keys).

Why in protocol/: the diagnosis writes these keys and the document (a layer above) reads them;
here, below both, importing ``kinetoscope.document`` does not import the diagnosis package (and
its Polars/numpy), so ``kscope analyze --only <analysis>`` loads no diagnosis module.

``DIAGNOSIS_KEYS`` are the first contract; ``EXTRA_DIAGNOSIS_KEYS`` were added after it
(docs/diagnosis.md section 11) and are ``null`` when the job does not show the problem. Each can
be selected with ``kscope analyze --only``. The summary lines go under ``diagnosis_summary``.
"""

from __future__ import annotations

DIAGNOSIS_KEYS = ("job", "steps", "stragglers", "mfu", "recommendations")
EXTRA_DIAGNOSIS_KEYS = ("pipeline", "uneven_inputs", "recompilation", "evidence")
ALL_DIAGNOSIS_KEYS = (*DIAGNOSIS_KEYS, *EXTRA_DIAGNOSIS_KEYS)
