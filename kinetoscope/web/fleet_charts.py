"""Plotly figures of the Fleet page and of a job's page: where the fleet's GPU-hours go (top jobs
by wasted GPU-hours), and each job's GPU busy share across its samples.

Figures are plain dicts (``{"figure": {"data", "layout"}, "height", "links", "link_by"}``) embedded in the
page as JSON and drawn by ``static/fleet.js`` with the plotly.js bundled in the ``plotly``
package (served at ``/static/plotly.min.js``: no CDN, no network). ``links`` (one same-site URL
per bar, ``link_by`` ``point``, or per line, ``curve``) make a click open the job's page. Labels from the catalog (job keys,
command lines) go through ``plotly_text`` so they are drawn literally.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from kinetoscope.report.escape import plotly_text

TOP_JOBS = 10  # bars in the wasted GPU-hours chart
TREND_JOBS = 8  # lines in the fleet trend chart
_FONT = {"family": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", "size": 12}


def job_url(job_key: str) -> str:
    return "/jobs/" + quote(str(job_key), safe="")


def _layout(**extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "margin": {"l": 60, "r": 20, "t": 30, "b": 50},
        "font": _FONT,
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
        "hoverlabel": {"namelength": -1},
        "legend": {"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"},
    }
    layout.update(extra)
    return layout


def waste_chart(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Horizontal bars: the :data:`TOP_JOBS` jobs with the most wasted GPU-hours, largest on top;
    None when no job wasted any."""
    top = sorted((r for r in rows if r["wasted_gpu_hours"] > 0), key=lambda r: -r["wasted_gpu_hours"])[
        :TOP_JOBS
    ]
    if not top:
        return None
    top.reverse()  # Plotly draws the first category at the bottom
    labels = [plotly_text(r["job_key"], 48) for r in top]
    hover = [
        f"{plotly_text(r['job_key'])}<br>{r['wasted_gpu_hours']:,.2f} GPU-h wasted over "
        f"{r['samples_recorded']} usable samples<br>GPU busy (latest) "
        + (f"{r['gpu_busy_pct']:.1f} %" if isinstance(r["gpu_busy_pct"], (int, float)) else "–")
        for r in top
    ]
    data = [
        {
            "type": "bar",
            "orientation": "h",
            "x": [round(r["wasted_gpu_hours"], 3) for r in top],
            "y": labels,
            "text": [f"{r['wasted_gpu_hours']:,.1f} GPU-h" for r in top],
            "textposition": "auto",
            "hovertext": hover,
            "hoverinfo": "text",
            "marker": {"color": "#c23b3b"},
            "name": "wasted GPU-hours",
        }
    ]
    layout = _layout(
        xaxis={"title": {"text": "wasted GPU-hours (GPU-h)"}, "rangemode": "tozero"},
        yaxis={"automargin": True, "type": "category"},
        showlegend=False,
    )
    return {
        "figure": {"data": data, "layout": layout},
        "height": 90 + 34 * len(top),
        "links": [job_url(r["job_key"]) for r in top],
        "link_by": "point",
    }


def _busy_points(samples: Sequence[Mapping[str, Any]], state: str) -> tuple[list[Any], list[Any], list[str]]:
    xs, ys, text = [], [], []
    for s in samples:
        if s.get("state") == state and isinstance(s.get("gpu_busy_pct"), (int, float)) and s.get("created"):
            xs.append(s["created"])
            ys.append(round(float(s["gpu_busy_pct"]), 2))
            why = f"<br>not ranked: {plotly_text(s.get('reason'))}" if state == "unusable" else ""
            text.append(f"{plotly_text(s.get('sample_id'))}<br>GPU busy {s['gpu_busy_pct']:.1f} %{why}")
    return xs, ys, text


def _unusable_trace(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    xs, ys, text = _busy_points(samples, "unusable")
    if not xs:
        return None
    return {
        "type": "scatter",
        "mode": "markers",
        "x": xs,
        "y": ys,
        "hovertext": text,
        "hoverinfo": "text",
        "name": "unusable sample (not ranked)",
        "marker": {"symbol": "x", "size": 9, "color": "#9aa5b1"},
    }


def trend_chart(rows: Sequence[Mapping[str, Any]], jobs: int = TREND_JOBS) -> dict[str, Any] | None:
    """One line per job (the ``jobs`` that waste most): GPU busy % of each usable sample over
    time; unusable samples as grey crosses. None when no job has a usable sample with a figure."""
    data: list[dict[str, Any]] = []
    links: list[str] = []
    ranked = [r for r in rows if r["samples_recorded"]][:jobs]
    for r in ranked:
        xs, ys, text = _busy_points(r["samples"], "recorded")
        if not xs:
            continue
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "x": xs,
                "y": ys,
                "hovertext": [f"{plotly_text(r['job_key'])}<br>{t}" for t in text],
                "hoverinfo": "text",
                "name": plotly_text(r["job_key"], 40),
            }
        )
        links.append(job_url(r["job_key"]))
    if not data:
        return None
    bad = _unusable_trace([s for r in ranked for s in r["samples"]])
    if bad is not None:
        data.append(bad)
        links.append("")
    layout = _layout(
        xaxis={"title": {"text": "sample time (UTC)"}, "type": "date"},
        yaxis={"title": {"text": "GPU busy (%)"}, "range": [0, 105]},
        margin={"l": 60, "r": 20, "t": 60, "b": 50},
    )
    return {"figure": {"data": data, "layout": layout}, "height": 380, "links": links, "link_by": "curve"}


def job_chart(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """A job's page: GPU busy % of each usable sample (line) and of each unusable one (crosses)."""
    xs, ys, text = _busy_points(samples, "recorded")
    data: list[dict[str, Any]] = []
    if xs:
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "x": xs,
                "y": ys,
                "hovertext": text,
                "hoverinfo": "text",
                "name": "usable sample",
            }
        )
    bad = _unusable_trace(samples)
    if bad is not None:
        data.append(bad)
    if not data:
        return None
    layout = _layout(
        xaxis={"title": {"text": "sample time (UTC)"}, "type": "date"},
        yaxis={"title": {"text": "GPU busy (%)"}, "range": [0, 105]},
        margin={"l": 60, "r": 20, "t": 40, "b": 50},
    )
    return {"figure": {"data": data, "layout": layout}, "height": 300, "links": [], "link_by": "curve"}
