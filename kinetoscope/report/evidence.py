"""The evidence card: what a verdict rests on, for the HTML report and the web analysis page.

Reads the ``evidence`` part of the typed document (``kinetoscope.document.parts.Evidence``,
docs/diagnosis.md §Evidence); documents written before it existed have none, and the card is
then left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kinetoscope.document import AnalysisDocument, as_document
from kinetoscope.document.parts import Evidence, EvidenceRank


def _yes_no(v: bool | None, yes: str, no: str) -> str:
    return "–" if v is None else (yes if v else no)


def _status(ev: Evidence) -> tuple[str, str]:
    if not ev.assessed:
        return f"NOT ASSESSED: {ev.reason}", "bad"
    if ev.anomalous:
        return "verdict on anomalous data (confidence lowered)", "warn"
    return "the data can carry the verdict", "good"


def _rank_row(r: EvidenceRank) -> dict[str, Any]:
    return {
        "rank": r.rank,
        "events": r.events,
        "steps": r.steps,
        "first step": r.first_step,
        "last step": r.last_step,
        "window (ms)": _window(r),
        "salvaged": "yes" if r.salvaged else "",
        "empty": "EMPTY" if r.empty else ("near-empty" if r.near_empty else ""),
        "start-up step": f"{r.startup_step_ratio:g}x" if r.startup_step_ratio else "",
        "timestamp anomalies": r.timestamps.total if r.timestamps is not None else 0,
    }


def evidence_view(document: AnalysisDocument | Mapping[str, Any]) -> dict[str, Any] | None:
    """``status`` (assessed / NOT ASSESSED / on anomalous data), ``cls`` (good/warn/bad),
    ``facts`` (label, value), ``ranks`` (row objects), ``anomalies`` and the text ``lines``;
    None without an evidence block."""
    ev = as_document(document).evidence
    if ev is None:
        return None
    status, cls = _status(ev)
    common = ev.steps_in_common
    facts = [
        ("ranks traced", str(len(ev.ranks))),
        ("steps in common", (str(common) if common is not None else "–") if len(ev.ranks) > 1 else "–"),
        ("steps asked", str(ev.steps_asked) if ev.steps_asked else "–"),
        ("windows overlap", _yes_no(ev.windows_overlap, "yes", "NO")),
        ("windows aligned", _yes_no(ev.windows_aligned, "yes", "NO")),
        ("timestamp anomalies", str(ev.timestamp_anomalies or 0)),
        ("anomalies named", str(len(ev.anomalies))),
    ]
    return {
        "status": status,
        "cls": cls,
        "command": ev.command,
        "facts": facts,
        "ranks": [_rank_row(r) for r in ev.ranks],
        "anomalies": [
            {
                "kind": a.kind,
                "ranks": ", ".join(map(str, a.ranks)),
                "count": a.count,
                "what": a.message,
                "left out": a.left_out or "",
            }
            for a in ev.anomalies
        ],
        "lines": list(ev.lines),
    }


def _window(r: EvidenceRank) -> str:
    a, b = r.window_start_ms, r.window_end_ms
    if a is None or b is None:
        return "–"
    return f"{a:,.0f} – {b:,.0f}"
