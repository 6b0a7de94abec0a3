"""The Fleet page of ``kscope serve``: totals for the window (GPU-hours wasted, jobs sampled,
shares with stragglers, low utilisation, launch-bound), a chart of the top jobs by wasted
GPU-hours and a trend of GPU busy % per job across samples (Plotly, ``web.fleet_charts``), then
the autopilot jobs ranked by wasted GPU-hours, with filters, a sparkline per job (server-side
SVG), each job a link to its page with its samples, and links to its latest sample's report and
trace page (Perfetto). JSON at ``/api/fleet``. Also the data of the Jobs page and of a job's
page (:func:`job_list`, :func:`job_view`), which ``web.pages`` renders.

A FastAPI ``APIRouter``; ``web/app.py`` includes it with one line. It reads the app's open
catalog (``request.app.state.catalog``) through ``kinetoscope.store.fleet`` and shares the
listing code of ``kscope jobs`` (``kinetoscope.autopilot.fleetview``). Only usable samples
(state ``recorded``) count in the figures and the ranking.
"""

from __future__ import annotations

import functools
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse

import kinetoscope
from kinetoscope.autopilot.fleetview import LOW_UTIL_PCT, all_job_rows, fleet_rows, fleet_totals
from kinetoscope.errors import UsageError
from kinetoscope.report.escape import json_for_script
from kinetoscope.store.fleet import FleetStore
from kinetoscope.web.fleet_charts import job_chart, trend_chart, waste_chart

router = APIRouter()
_TEMPLATES = Path(__file__).resolve().parent / "templates"
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'self'; form-action 'self'"
)
TREND_W, TREND_H = 120, 28


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_TEMPLATES)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["urlpart"] = lambda s: quote(str(s), safe="")
    env.filters["num"] = lambda v, d=1: (
        "–" if v is None else (f"{v:,.{d}f}" if isinstance(v, float) else str(v))
    )
    env.filters["pct"] = lambda v, d=1: "–" if not isinstance(v, (int, float)) else f"{100 * v:.{d}f}"
    env.filters["when"] = lambda v: "–" if not v else str(v).replace("T", " ").replace("Z", "")
    env.filters["cls"] = lambda v: str(v or "").replace(" ", "-")
    return env


#: the Fleet page's windows: query value -> (label, hours; None = every sample)
WINDOWS: dict[str, tuple[str, float | None]] = {
    "all": ("all samples", None),
    "24h": ("last 24 hours", 24.0),
    "7d": ("last 7 days", 168.0),
    "30d": ("last 30 days", 720.0),
}


def _since(window: str) -> datetime | None:
    if window not in WINDOWS:
        raise UsageError(f"window {window!r}: choose one of {', '.join(WINDOWS)}")
    hours = WINDOWS[window][1]
    return None if hours is None else datetime.now(timezone.utc) - timedelta(hours=hours)


def trend_points(values: list[float | None]) -> str:
    """SVG polyline points of GPU busy % (0-100) over the samples, oldest left; '' for fewer than 2."""
    ys = [v for v in values if isinstance(v, (int, float))]
    if len(ys) < 2:
        return ""
    step = TREND_W / (len(ys) - 1)
    return " ".join(
        f"{i * step:.1f},{TREND_H - max(0.0, min(100.0, y)) / 100 * TREND_H:.1f}" for i, y in enumerate(ys)
    )


def _where(
    gpu_below: float | None, mfu_below: float | None, launch_above: float | None, where: str | None
) -> str | None:
    parts = [where] if where else []
    if gpu_below is not None:
        parts.append(f"gpu_util < {gpu_below}")
    if mfu_below is not None:  # the form takes a percentage, the listing a fraction
        parts.append(f"mfu < {mfu_below / 100:.6g}")
    if launch_above is not None:
        parts.append(f"launch_bound > {launch_above}")
    return " and ".join(parts) or None


def _rows(
    request: Request, sort: str, where: str | None, straggler: bool, since: datetime | None
) -> list[dict[str, Any]]:
    rows = fleet_rows(
        FleetStore(request.app.state.catalog), sort=sort, where=where, straggler=straggler, since=since
    )
    for r in rows:
        recorded = [s for s in r["samples"] if s["state"] == "recorded"]
        r["trend"] = trend_points([s.get("gpu_busy_pct") for s in recorded])
        r["latest_trace"] = recorded[-1]["trace_id"] if recorded else None
    return rows


def _number(name: str, text: str | None) -> float | None:
    """A filter field of the form: empty means unset (a browser sends every field)."""
    if text is None or not text.strip():
        return None
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"{name} must be a number, got {text!r}") from None


def _charts(**charts: dict[str, Any] | None) -> str:
    """The charts a page draws (``static/fleet.js``), as JSON safe inside a script element."""
    return json_for_script({k.replace("_", "-"): v for k, v in charts.items() if v is not None})


def _render(request: Request, template: str, status: int = 200, **ctx: Any) -> HTMLResponse:
    html = (
        _env()
        .get_template(template)
        .render(
            request=request,
            version=kinetoscope.__version__,
            catalog=request.app.state.catalog.display_url,
            perfetto=request.app.state.perfetto is not None,
            **ctx,
        )
    )
    return HTMLResponse(html, status_code=status, headers={"Content-Security-Policy": _CSP})


@router.get("/fleet", response_class=HTMLResponse, include_in_schema=False)
def fleet_page(
    request: Request,
    sort: str = "waste",
    gpu_below_text: str | None = Query(None, alias="gpu_below"),
    mfu_below_text: str | None = Query(None, alias="mfu_below"),
    launch_above_text: str | None = Query(None, alias="launch_above"),
    straggler: bool = False,
    where: str | None = None,
    window: str = "all",
) -> HTMLResponse:
    error = None
    gpu_below = mfu_below = launch_above = None
    try:
        gpu_below = _number("GPU busy below", gpu_below_text)
        mfu_below = _number("MFU below", mfu_below_text)
        launch_above = _number("launch-bound above", launch_above_text)
        since = _since(window)
        rows = _rows(request, sort, _where(gpu_below, mfu_below, launch_above, where), straggler, since)
    except UsageError as exc:
        rows, error = [], str(exc)
    return _render(
        request,
        "fleet.html.j2",
        400 if error else 200,
        rows=rows,
        totals=fleet_totals(rows),
        charts=_charts(fleet_waste=waste_chart(rows), fleet_trend=trend_chart(rows)),
        sort=sort,
        gpu_below=gpu_below,
        mfu_below=mfu_below,
        launch_above=launch_above,
        straggler=straggler,
        where=where or "",
        window=window,
        windows=WINDOWS,
        low_util=f"{LOW_UTIL_PCT:g}",
        error=error,
        trend_w=TREND_W,
        trend_h=TREND_H,
    )


@router.get(
    "/api/fleet", tags=["catalog"], summary="Autopilot jobs ranked by wasted GPU-hours, with their samples"
)
def fleet_api(
    request: Request,
    sort: str = "waste",
    where: str | None = None,
    straggler: bool = False,
    window: str = "all",
) -> JSONResponse:
    try:
        rows = fleet_rows(
            FleetStore(request.app.state.catalog),
            sort=sort,
            where=where,
            straggler=straggler,
            since=_since(window),
        )
    except UsageError as exc:
        return JSONResponse({"detail": str(exc)}, status_code=400)
    return JSONResponse({"jobs": rows, "totals": fleet_totals(rows).to_dict()})


def job_list(catalog: Any) -> list[dict[str, Any]]:
    """The Jobs page: every job the catalog knows, by hand or by the autopilot (``all_job_rows``)."""
    return all_job_rows(FleetStore(catalog))


def job_view(catalog: Any, job_id: str) -> dict[str, Any] | None:
    """A job's page, autopilot part: its listing row (samples included) and its chart as page
    JSON; None when the autopilot never saw the job (and no merged Slurm job has that id)."""
    row = next((r for r in job_list(catalog) if r["job_key"] == job_id and r["source"] != "manual"), None)
    if row is None:
        return None
    return {
        "row": row,
        "charts": _charts(job_trend=job_chart(row["samples"])),
        "due": _due_text(row["next_due"]),
    }


def _due_text(next_due: str | None) -> str:
    """``next sample due now`` or ``next sample due 2026-11-28 13:53:28 UTC``."""
    if not next_due:
        return "no sample planned"
    at = datetime.strptime(next_due, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    if at <= datetime.now(timezone.utc):
        return "next sample due now (at the autopilot's next cycle)"
    return f"next sample due {at:%Y-%m-%d %H:%M:%S} UTC"


def job_page_context(catalog: Any, job_id: str) -> dict[str, Any] | None:
    """What a job's page shows: the catalog's job (or the autopilot's row when the catalog has
    none under that id), every trace request of it (by hand and the autopilot's samples), and
    the autopilot part (:func:`job_view`, None for a job only traced by hand). None: no such job."""
    job: Any = catalog.get_job(job_id)
    fleet = job_view(catalog, job_id)
    if job is None and fleet is None:
        return None
    traces = catalog.trace_requests(job_id=job_id, limit=None) if job is not None else []
    if fleet is not None:
        row = fleet["row"]
        if job is None:
            job = row
        kineto = job_id.removeprefix("slurm:") if job_id.startswith("slurm:") else None
        if kineto:
            traces += catalog.trace_requests(job_id=kineto, limit=None)
        for s in row["samples"]:
            rec = catalog.get_trace_request(s["trace_id"])
            if rec is not None:
                traces.append(rec)
    unique = {t.trace_id: t for t in traces}
    ordered = sorted(unique.values(), key=lambda t: (t.created or t.recorded_at, t.trace_id), reverse=True)
    return {"job": job, "traces": ordered, "fleet": fleet}
