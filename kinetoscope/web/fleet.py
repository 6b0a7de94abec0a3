"""The Fleet page of ``kscope serve``: autopilot jobs ranked by wasted GPU-hours, with filters, a
small trend chart per job (GPU busy % over its samples, drawn server-side as SVG: no script) and
links to each sample's report and trace page (Perfetto). JSON at ``/api/fleet``.

A FastAPI ``APIRouter``; ``web/app.py`` includes it with one line. It reads the app's open
catalog (``request.app.state.catalog``) through ``kinetoscope.store.fleet`` and shares the
listing code of ``kscope jobs`` (``kinetoscope.autopilot.fleetview``).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse

import kinetoscope
from kinetoscope.autopilot.fleetview import fleet_rows
from kinetoscope.errors import UsageError
from kinetoscope.store.fleet import FleetStore

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
    return env


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
    if mfu_below is not None:
        parts.append(f"mfu < {mfu_below}")
    if launch_above is not None:
        parts.append(f"launch_bound > {launch_above}")
    return " and ".join(parts) or None


def _rows(request: Request, sort: str, where: str | None, straggler: bool) -> list[dict[str, Any]]:
    rows = fleet_rows(FleetStore(request.app.state.catalog), sort=sort, where=where, straggler=straggler)
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


@router.get("/fleet", response_class=HTMLResponse, include_in_schema=False)
def fleet_page(
    request: Request,
    sort: str = "waste",
    gpu_below_text: str | None = Query(None, alias="gpu_below"),
    mfu_below_text: str | None = Query(None, alias="mfu_below"),
    launch_above_text: str | None = Query(None, alias="launch_above"),
    straggler: bool = False,
    where: str | None = None,
) -> HTMLResponse:
    error = None
    gpu_below = mfu_below = launch_above = None
    try:
        gpu_below = _number("GPU busy below", gpu_below_text)
        mfu_below = _number("MFU below", mfu_below_text)
        launch_above = _number("launch-bound above", launch_above_text)
        rows = _rows(request, sort, _where(gpu_below, mfu_below, launch_above, where), straggler)
    except UsageError as exc:
        rows, error = [], str(exc)
    html = (
        _env()
        .get_template("fleet.html.j2")
        .render(
            request=request,
            version=kinetoscope.__version__,
            catalog=request.app.state.catalog.display_url,
            perfetto=request.app.state.perfetto is not None,
            rows=rows,
            sort=sort,
            gpu_below=gpu_below,
            mfu_below=mfu_below,
            launch_above=launch_above,
            straggler=straggler,
            where=where or "",
            error=error,
            trend_w=TREND_W,
            trend_h=TREND_H,
        )
    )
    return HTMLResponse(html, status_code=400 if error else 200, headers={"Content-Security-Policy": _CSP})


@router.get(
    "/api/fleet", tags=["catalog"], summary="Autopilot jobs ranked by wasted GPU-hours, with their samples"
)
def fleet_api(
    request: Request, sort: str = "waste", where: str | None = None, straggler: bool = False
) -> JSONResponse:
    try:
        rows = fleet_rows(FleetStore(request.app.state.catalog), sort=sort, where=where, straggler=straggler)
    except UsageError as exc:
        return JSONResponse({"detail": str(exc)}, status_code=400)
    return JSONResponse({"jobs": rows})
