"""The one summary of an analysis document: the figures a listing shows for an analysis.

Used by the catalog record (``record_analysis(summary=...)``, via ``Summary.catalog_fields``),
the report's headline cards, ``kscope analyze`` and the autopilot's samples. Terms:

* ``step_time_ms`` — the median over steps of the median over ranks of the step time (the
  diagnosis ``steps`` table, else the ``step_durations`` analysis).
* ``straggler_kind`` / ``straggler_ranks`` — the straggler verdict's kind (a string as the
  verdict names it) and the ranks it names.
* ``lost_fraction`` — the share of step time lost to stragglers, as the straggler
  recommendation's evidence estimates it (None without one).
* ``world_size`` — the job's (``job``), else the one world size every trace agrees on.
* ``mfu`` — model FLOPs utilisation (None when it could not be computed).
* ``verdict`` — the first line of the diagnosis summary.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import msgspec

from kinetoscope.document.decode import decode
from kinetoscope.document.model import AnalysisDocument
from kinetoscope.protocol.structinfo import prime_structs

# The listing fields the catalog stores, in the order it always stored them.
CATALOG_FIELDS = ("step_time_ms", "straggler_kind", "straggler_ranks", "world_size", "mfu", "verdict")


class Summary(msgspec.Struct, kw_only=True):
    """The summary of one document (module docstring defines the fields); None = unknown."""

    step_time_ms: float | None = None
    straggler_kind: str | None = None
    straggler_ranks: list[int] | None = None
    lost_fraction: float | None = None
    world_size: int | None = None
    mfu: float | None = None
    verdict: str | None = None

    def catalog_fields(self) -> dict[str, Any]:
        """The catalog's listing fields (``CATALOG_FIELDS``), the unknown ones left out."""
        return {k: v for k in CATALOG_FIELDS if (v := getattr(self, k)) is not None}


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def step_time_ms(doc: AnalysisDocument) -> float | None:
    """Median over steps of the median over ranks (module docstring), in ms."""
    per_step: defaultdict[int | None, list[float]] = defaultdict(list)
    for row in doc.steps or []:
        if row.step_time_us is not None:
            per_step[row.step].append(row.step_time_us)
    if not per_step:
        for d in doc.step_durations or []:
            if d.duration_us is not None:
                per_step[d.step].append(d.duration_us)
    if not per_step:
        return None
    return statistics.median(statistics.median(v) for v in per_step.values()) / 1000.0


def world_size(doc: AnalysisDocument) -> int | None:
    """The job's world size, else the one every trace agrees on."""
    if doc.job is not None and doc.job.world_size is not None:
        return doc.job.world_size
    sizes = {t.world_size for t in doc.traces if t.world_size is not None}
    return sizes.pop() if len(sizes) == 1 else None


def straggler_lost_fraction(doc: AnalysisDocument) -> float | None:
    """``lost_fraction`` of the first straggler recommendation's evidence."""
    for rec in doc.recommendations or []:
        if rec.id.startswith("straggler"):
            return _num(rec.evidence["lost_fraction"]) if "lost_fraction" in rec.evidence else None
    return None


def summarize(doc: AnalysisDocument | Mapping[str, Any]) -> Summary:
    """The summary of a document (typed, or its JSON form, decoded first)."""
    d = doc if isinstance(doc, AnalysisDocument) else decode(doc)
    s = d.stragglers
    return Summary(
        step_time_ms=step_time_ms(d),
        straggler_kind=s.kind if s is not None else None,
        straggler_ranks=list(s.ranks) if s is not None else None,
        lost_fraction=straggler_lost_fraction(d),
        world_size=world_size(d),
        mfu=d.mfu.mfu if d.mfu is not None else None,
        verdict=d.summary_lines[0] if d.summary_lines else None,
    )


prime_structs(globals())
