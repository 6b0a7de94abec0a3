"""The analysis document as one typed object (``AnalysisDocument``) and its key list.

Terms: the *document* is what ``kscope analyze --json`` prints and the catalog stores: one key
per analysis (a list of row objects), the diagnosis keys (``job``, ``stragglers``, ...),
``traces``, ``notes`` and ``errors``. A *part* is the typed read form of one key. A part is
``None`` when its key is absent, ``null`` or of another shape (``problems`` then says which and
why), so a view tells "not run" from "empty" without reading the dict.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kinetoscope.document.analyses import (
    IdleRow,
    KernelRow,
    KernelTypeRow,
    OverlapRow,
    StepDurationRow,
    TemporalRow,
)
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
from kinetoscope.protocol.document_keys import ALL_DIAGNOSIS_KEYS, DIAGNOSIS_KEYS, EXTRA_DIAGNOSIS_KEYS
from kinetoscope.protocol.structinfo import prime_structs

# Every top-level key of the document the views know, in document order; any other key is an
# analysis (``tables``) or a key a newer producer added.
DOCUMENT_KEYS = ("traces", "diagnosis_summary", *ALL_DIAGNOSIS_KEYS, "notes", "errors")

__all__ = ["DIAGNOSIS_KEYS", "DOCUMENT_KEYS", "EXTRA_DIAGNOSIS_KEYS", "AnalysisDocument"]


class AnalysisDocument(msgspec.Struct, kw_only=True):
    """The decoded document (``kinetoscope.document.decode``).

    Diagnosis parts: ``job``, ``steps``, ``stragglers``, ``mfu``, ``recommendations``,
    ``pipeline``, ``uneven_inputs``, ``recompilation``, ``evidence``;
    ``summary_lines`` is ``diagnosis_summary``. Analyses the views chart are typed
    (``temporal_breakdown``, ...); ``tables`` holds every list-valued key as its row objects (for
    display, columns in the producer's order) and ``other`` every other key it does not know."""

    traces: list[TraceMeta] = msgspec.field(default_factory=list)
    summary_lines: list[str] | None = None
    job: Job | None = None
    steps: list[StepRow] | None = None
    stragglers: Stragglers | None = None
    mfu: Mfu | None = None
    recommendations: list[Recommendation] | None = None
    pipeline: Pipeline | None = None
    uneven_inputs: UnevenInputs | None = None
    recompilation: Recompilation | None = None
    evidence: Evidence | None = None
    step_durations: list[StepDurationRow] | None = None
    temporal_breakdown: list[TemporalRow] | None = None
    temporal_breakdown_by_step: list[TemporalRow] | None = None
    idle_time_breakdown: list[IdleRow] | None = None
    kernel_type_breakdown: list[KernelTypeRow] | None = None
    kernel_breakdown: list[KernelRow] | None = None
    kernel_distribution: list[KernelRow] | None = None
    comm_comp_overlap: list[OverlapRow] | None = None
    tables: dict[str, list[dict[str, Any]]] = msgspec.field(default_factory=dict)
    objects: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    keys: list[str] = msgspec.field(default_factory=list)  # the document's keys, in order
    notes: dict[str, str] = msgspec.field(default_factory=dict)
    errors: dict[str, str] = msgspec.field(default_factory=dict)
    problems: list[str] = msgspec.field(default_factory=list)  # parts that did not decode, and why

    def has(self, key: str) -> bool:
        """Whether the document has the key (whatever its value)."""
        return key in self.keys

    def rows(self, key: str) -> list[dict[str, Any]]:
        """The row objects of a list-valued key (empty when absent): for tables."""
        return self.tables[key] if key in self.tables else []

    def note_for(self, *names: str) -> str | None:
        """Why the analyses ``names`` have no rows: the first failure or note among them, else
        the first that was not run; None when each has a result."""
        for n in names:
            if n in self.errors:
                return f"the {n} analysis failed: {self.errors[n]}"
            if n in self.notes:
                note = self.notes[n]
                if note == "no GPU events":
                    return "no GPU events in these traces (CPU-only): this view needs GPU kernels"
                return note
        for n in names:
            if not self.has(n):
                return f"the document has no '{n}' result (the analysis was not run)"
        return None


prime_structs(globals())
