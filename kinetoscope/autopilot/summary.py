"""The per-sample diagnosis summary the autopilot records, from an analysis document.

Definitions (docs/autopilot.md):

* ``gpu_busy_pct`` — 100 − the mean over ranks of the temporal breakdown's GPU idle share;
  None when the trace has no GPU kernels (CPU-only jobs).
* ``exposed_comm_pct`` — communication not overlapped with computation, as a share of the GPU
  timeline (mean over ranks of (communication − overlap) / (idle + compute + non-compute)).
* ``launch_bound_pct`` — the ``launch-bound`` recommendation's launch-gap fraction × 100
  (0 when the diagnosis did not flag it; None without GPU kernels).
* ``lost_fraction`` — step time lost to stragglers (the straggler recommendation's estimate).
* ``top_recommendation`` / ``top_recommendation_title`` — the first recommendation's id and title.
* ``wasted_gpu_s`` — idle share × devices × interval: the GPU-seconds this sample stands for
  that did no work. None when the busy share is unknown.

The straggler fields, ``mfu`` and ``lost_fraction`` are the document's one summary
(``kinetoscope.document.summarize``), the figures the catalog and the report show too.
"""

from __future__ import annotations

from collections.abc import Mapping
from statistics import fmean
from typing import Any

from kinetoscope.document import AnalysisDocument, as_document
from kinetoscope.document import summarize as document_summary


def gpu_busy_pct(doc: AnalysisDocument) -> float | None:
    idle = [r.idle_time_pctg for r in doc.temporal_breakdown or [] if r.idle_time_pctg is not None]
    return round(100.0 - fmean(idle), 3) if idle else None


def exposed_comm_pct(doc: AnalysisDocument) -> float | None:
    totals: dict[int | None, float] = {}
    for r in doc.temporal_breakdown or []:
        parts = (r.idle_time_us, r.compute_time_us, r.non_compute_time_us)
        if all(p is not None for p in parts):
            totals[r.rank] = sum(p for p in parts if p is not None)
    shares = []
    for o in doc.comm_comp_overlap or []:
        comm, overlap, total = o.communication_time_us, o.overlap_time_us, totals.get(o.rank)
        if comm is not None and overlap is not None and total:
            shares.append(100.0 * max(0.0, comm - overlap) / total)
    return round(fmean(shares), 3) if shares else None


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def launch_bound_pct(doc: AnalysisDocument, busy: float | None) -> float | None:
    for rec in doc.recommendations or []:
        if rec.id == "launch-bound" and "launch_gap_fraction" in rec.evidence:
            gap = _number(rec.evidence["launch_gap_fraction"])
            if gap is not None:
                return round(100.0 * gap, 3)
    return 0.0 if busy is not None else None


def summarize(
    document: AnalysisDocument | Mapping[str, Any], devices: int, interval_s: float
) -> dict[str, Any]:
    """The ``fleet_samples`` summary columns for an analysis document (module docstring)."""
    doc = as_document(document)
    s = document_summary(doc)
    busy = gpu_busy_pct(doc)
    recs = doc.recommendations or []
    wasted = round((100.0 - busy) / 100.0 * devices * interval_s, 3) if busy is not None else None
    return {
        "interval_s": interval_s,
        "devices": devices,
        "gpu_busy_pct": busy,
        "mfu": s.mfu,
        "straggler_kind": s.straggler_kind,
        "straggler_ranks": s.straggler_ranks or None,
        "lost_fraction": s.lost_fraction,
        "exposed_comm_pct": exposed_comm_pct(doc),
        "launch_bound_pct": launch_bound_pct(doc, busy),
        "top_recommendation": recs[0].id if recs and recs[0].id else None,
        "top_recommendation_title": recs[0].title[:256] if recs and recs[0].title else None,
        "wasted_gpu_s": wasted,
    }
