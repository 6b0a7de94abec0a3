"""The evidence card: what a verdict rests on, for the HTML report and the web analysis page.

Reads the ``evidence`` key of an analysis document (``diagnosis.evidence``, docs/diagnosis.md
§Evidence); documents written before it existed have none, and the card is then left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _yes_no(v: Any, yes: str, no: str) -> str:
    return "–" if v is None else (yes if v else no)


def evidence_view(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """``status`` (assessed / NOT ASSESSED / on anomalous data), ``cls`` (good/warn/bad),
    ``facts`` (label, value), ``ranks`` (row objects), ``anomalies`` and the text ``lines``;
    None without an evidence block."""
    ev = doc.get("evidence")
    if not isinstance(ev, Mapping):
        return None
    ranks = [r for r in ev.get("ranks") or [] if isinstance(r, Mapping)]
    anomalies = [a for a in ev.get("anomalies") or [] if isinstance(a, Mapping)]
    if not ev.get("assessed", True):
        status, cls = f"NOT ASSESSED: {ev.get('reason')}", "bad"
    elif ev.get("anomalous"):
        status, cls = "verdict on anomalous data (confidence lowered)", "warn"
    else:
        status, cls = "the data can carry the verdict", "good"
    facts = [
        ("ranks traced", str(len(ranks))),
        ("steps in common", str(ev.get("steps_in_common", "–")) if len(ranks) > 1 else "–"),
        ("steps asked", str(ev.get("steps_asked")) if ev.get("steps_asked") else "–"),
        ("windows overlap", _yes_no(ev.get("windows_overlap"), "yes", "NO")),
        ("windows aligned", _yes_no(ev.get("windows_aligned"), "yes", "NO")),
        ("timestamp anomalies", str(ev.get("timestamp_anomalies", 0))),
        ("anomalies named", str(len(anomalies))),
    ]
    rows = [
        {
            "rank": r.get("rank"),
            "events": r.get("events"),
            "steps": r.get("steps"),
            "first step": r.get("first_step"),
            "last step": r.get("last_step"),
            "window (ms)": _window(r),
            "salvaged": "yes" if r.get("salvaged") else "",
            "empty": "EMPTY" if r.get("empty") else ("near-empty" if r.get("near_empty") else ""),
            "start-up step": f"{r['startup_step_ratio']:g}x" if r.get("startup_step_ratio") else "",
            "timestamp anomalies": (r.get("timestamps") or {}).get("total", 0),
        }
        for r in ranks
    ]
    return {
        "status": status,
        "cls": cls,
        "command": ev.get("command"),
        "facts": facts,
        "ranks": rows,
        "anomalies": [
            {
                "kind": a.get("kind"),
                "ranks": ", ".join(map(str, a.get("ranks") or [])),
                "count": a.get("count"),
                "what": a.get("message"),
                "left out": a.get("left_out") or "",
            }
            for a in anomalies
        ],
        "lines": [str(x) for x in ev.get("lines") or []],
    }


def _window(r: Mapping[str, Any]) -> str:
    a, b = r.get("window_start_ms"), r.get("window_end_ms")
    if a is None or b is None:
        return "–"
    return f"{a:,.0f} – {b:,.0f}"
