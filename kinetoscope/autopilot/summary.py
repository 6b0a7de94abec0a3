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
"""

from __future__ import annotations

from collections.abc import Mapping
from statistics import fmean
from typing import Any


def _rows(doc: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = doc.get(key)
    return [r for r in value if isinstance(r, Mapping)] if isinstance(value, list) else []


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def gpu_busy_pct(doc: Mapping[str, Any]) -> float | None:
    idle = [x for r in _rows(doc, "temporal_breakdown") if (x := _num(r.get("idle_time_pctg"))) is not None]
    return round(100.0 - fmean(idle), 3) if idle else None


def exposed_comm_pct(doc: Mapping[str, Any]) -> float | None:
    totals: dict[Any, float] = {}
    for r in _rows(doc, "temporal_breakdown"):
        parts = [_num(r.get(k)) for k in ("idle_time(us)", "compute_time(us)", "non_compute_time(us)")]
        if all(p is not None for p in parts):
            totals[r.get("rank")] = sum(p for p in parts if p is not None)
    shares = []
    for r in _rows(doc, "comm_comp_overlap"):
        comm, overlap, total = (
            _num(r.get("communication_time(us)")),
            _num(r.get("overlap_time(us)")),
            totals.get(r.get("rank")),
        )
        if comm is not None and overlap is not None and total:
            shares.append(100.0 * max(0.0, comm - overlap) / total)
    return round(fmean(shares), 3) if shares else None


def _recommendations(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return _rows(doc, "recommendations")


def launch_bound_pct(doc: Mapping[str, Any], busy: float | None) -> float | None:
    for rec in _recommendations(doc):
        if rec.get("id") == "launch-bound" and isinstance(rec.get("evidence"), Mapping):
            gap = _num(rec["evidence"].get("launch_gap_fraction"))
            if gap is not None:
                return round(100.0 * gap, 3)
    return 0.0 if busy is not None else None


def straggler_fields(doc: Mapping[str, Any]) -> dict[str, Any]:
    strag = doc.get("stragglers") if isinstance(doc.get("stragglers"), Mapping) else {}
    assert isinstance(strag, Mapping)
    kind = strag.get("kind")
    ranks = strag.get("ranks") if isinstance(strag.get("ranks"), list) else None
    lost = None
    for rec in _recommendations(doc):
        ev = rec.get("evidence")
        if str(rec.get("id", "")).startswith("straggler") and isinstance(ev, Mapping):
            lost = _num(ev.get("lost_fraction"))
            break
    return {
        "straggler_kind": str(kind) if kind is not None else None,
        "straggler_ranks": [int(r) for r in ranks if isinstance(r, int)] if ranks else None,
        "lost_fraction": lost,
    }


def summarize(doc: Mapping[str, Any], devices: int, interval_s: float) -> dict[str, Any]:
    """The ``fleet_samples`` summary columns for an analysis document (module docstring)."""
    busy = gpu_busy_pct(doc)
    mfu_doc = doc.get("mfu")
    mfu = _num(mfu_doc.get("mfu")) if isinstance(mfu_doc, Mapping) else None
    recs = _recommendations(doc)
    wasted = round((100.0 - busy) / 100.0 * devices * interval_s, 3) if busy is not None else None
    return {
        "interval_s": interval_s,
        "devices": devices,
        "gpu_busy_pct": busy,
        "mfu": mfu,
        **straggler_fields(doc),
        "exposed_comm_pct": exposed_comm_pct(doc),
        "launch_bound_pct": launch_bound_pct(doc, busy),
        "top_recommendation": str(recs[0].get("id")) if recs and recs[0].get("id") is not None else None,
        "top_recommendation_title": str(recs[0].get("title"))[:256]
        if recs and recs[0].get("title") is not None
        else None,
        "wasted_gpu_s": wasted,
    }
