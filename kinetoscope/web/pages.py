"""The HTML pages of ``kscope serve``: catalog listings, a trace request, an analysis and its
report, the trigger form, a task's progress and the API index.

Pages render Jinja2 templates (autoescaped) with :func:`render_page`; they are left out of the
OpenAPI schema (the JSON API in :mod:`kinetoscope.web.api` is the machine interface).
"""

from __future__ import annotations

import functools
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

import kinetoscope
from kinetoscope.errors import KinetoscopeError
from kinetoscope.units import fmt_bytes, fmt_datetime, fmt_fixed
from kinetoscope.web.actions import TriggerParams
from kinetoscope.web.context import WebContext, web_context

_HERE = Path(__file__).resolve().parent
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'self'; form-action 'self'"
)

router = APIRouter(include_in_schema=False)
Ctx = Depends(web_context)


# ---------------------------------------------------------------------------------------
# Templates
# ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_HERE / "templates")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["bytes"] = fmt_bytes
    env.filters["time"] = fmt_datetime
    env.filters["num"] = fmt_fixed
    env.filters["urlpart"] = lambda s: quote(str(s), safe="")
    return env


def render_page(request: Request, template: str, http_status: int = 200, **ctx: Any) -> HTMLResponse:
    """A template rendered with what every page shows (version, catalog, daemons, Perfetto)."""
    web: WebContext = request.app.state.ctx
    html = (
        _env()
        .get_template(template)
        .render(
            request=request,
            version=kinetoscope.__version__,
            catalog=web.catalog.display_url,
            daemons=web.settings.daemons,
            perfetto=web.perfetto is not None,
            **ctx,
        )
    )
    return HTMLResponse(html, status_code=http_status, headers={"Content-Security-Policy": PAGE_CSP})


def error_page(request: Request, status: int, title: str, message: str) -> HTMLResponse:
    return render_page(request, "error.html.j2", http_status=status, title=title, message=message)


# ---------------------------------------------------------------------------------------
# Catalog pages
# ---------------------------------------------------------------------------------------
@router.get("/", response_class=HTMLResponse)
def index(request: Request, web: WebContext = Ctx) -> HTMLResponse:
    catalog = web.catalog
    return render_page(
        request,
        "index.html.j2",
        jobs=catalog.jobs(limit=10),
        traces=catalog.trace_requests(limit=10),
        analyses=catalog.analyses(limit=10),
        tasks=web.tasks.list()[:10],
    )


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(request: Request, web: WebContext = Ctx) -> HTMLResponse:
    from kinetoscope.web.fleet import job_list  # every job: by hand and by the autopilot

    return render_page(request, "jobs.html.j2", jobs=job_list(web.catalog))


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: str, web: WebContext = Ctx) -> HTMLResponse:
    from kinetoscope.web.fleet import job_page_context  # the catalog's job and/or the autopilot's

    catalog = web.catalog
    ctx = job_page_context(catalog, job_id)
    if ctx is None:
        raise HTTPException(404, f"no job {job_id!r} in the catalog")
    traces = ctx["traces"]
    analyses = [a for t in traces for a in catalog.analyses(trace_id=t.trace_id, limit=20)]
    from kinetoscope.store.stacks_store import latest_stacks

    return render_page(
        request,
        "job.html.j2",
        job=ctx["job"],
        traces=traces,
        fleet=ctx["fleet"],
        analyses=sorted(analyses, key=lambda a: a.created, reverse=True),
        stacks=latest_stacks(catalog, job_id=job_id, limit=1),  # as web.stacks.latest_for_job
    )


@router.get("/traces", response_class=HTMLResponse)
def traces_page(
    request: Request, job_id: str | None = None, status: str | None = None, web: WebContext = Ctx
) -> HTMLResponse:
    traces = web.catalog.trace_requests(job_id=job_id, status=status, limit=500)
    return render_page(request, "traces.html.j2", traces=traces, job_id=job_id, status_filter=status)


@router.get("/traces/{trace_id}", response_class=HTMLResponse)
def trace_page(request: Request, trace_id: str, web: WebContext = Ctx) -> HTMLResponse:
    rec = web.trace_or_404(trace_id)
    running = web.tasks.running_for("analyze", trace_id)
    return render_page(
        request,
        "trace.html.j2",
        trace=rec,
        analyses=web.catalog.analyses(trace_id=trace_id, limit=50),
        running=running.to_json() if running else None,
        available={f.file: web.servable(f) for f in rec.files},
    )


@router.post("/traces/{trace_id}/analyze")
def analyze_action(trace_id: str, web: WebContext = Ctx) -> RedirectResponse:
    task = web.start_analysis(trace_id)
    return RedirectResponse(f"/tasks/{task.id}", status_code=303)


@router.get("/traces/{trace_id}/report")
def trace_report(request: Request, trace_id: str, web: WebContext = Ctx) -> Response:
    web.trace_or_404(trace_id)
    latest = web.catalog.analyses(trace_id=trace_id, limit=1)
    if not latest:
        return error_page(
            request,
            404,
            "No analysis yet",
            f"Trace {trace_id} has not been analysed yet: use “Analyze” on its page.",
        )
    return RedirectResponse(f"/analyses/{latest[0].id}/report", status_code=303)


@router.get("/analyses", response_class=HTMLResponse)
def analyses_page(request: Request, trace_id: str | None = None, web: WebContext = Ctx) -> HTMLResponse:
    analyses = web.catalog.analyses(trace_id=trace_id, limit=500)
    return render_page(request, "analyses.html.j2", analyses=analyses, trace_id=trace_id)


@router.get("/analyses/{analysis_id}", response_class=HTMLResponse)
def analysis_page(request: Request, analysis_id: int, web: WebContext = Ctx) -> HTMLResponse:
    a = web.analysis_or_404(analysis_id)
    from kinetoscope.document import decode
    from kinetoscope.report.evidence import evidence_view
    from kinetoscope.report.sections import verdict_view

    doc = decode(a.document)  # the stored document, typed once for the page
    return render_page(
        request,
        "analysis.html.j2",
        a=a,
        verdict=verdict_view(doc),
        evidence=evidence_view(doc),
        recs=doc.recommendations or [],
        errors=doc.errors,
    )


@router.get("/analyses/{analysis_id}/report", response_class=HTMLResponse)
def analysis_report(analysis_id: int, web: WebContext = Ctx) -> HTMLResponse:
    from kinetoscope.report.render import render_report

    a = web.analysis_or_404(analysis_id)
    nonce = secrets.token_urlsafe(16)
    links = {"analysis page": f"/analyses/{a.id}"}
    if a.trace_id:
        links["trace request"] = f"/traces/{quote(a.trace_id, safe='')}"
    html = render_report(
        a.document,
        title=f"Kinetoscope report — {a.trace_id or 'analysis ' + str(a.id)}",
        inputs=a.inputs,
        generated_at=a.created,
        nonce=nonce,
        links=links,
        plotly_src="/static/plotly.min.js",
    )
    csp = (
        f"default-src 'none'; script-src 'self' 'nonce-{nonce}'; style-src 'unsafe-inline'; "
        "img-src 'self' data: blob:; font-src data:; connect-src 'self'; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'self'"
    )
    return HTMLResponse(html, headers={"Content-Security-Policy": csp})


@router.get("/static/plotly.min.js")
def plotly_bundle() -> Response:
    from kinetoscope.report.render import plotly_js

    return Response(
        plotly_js(), media_type="text/javascript", headers={"Cache-Control": "public, max-age=86400"}
    )


# ---------------------------------------------------------------------------------------
# Trigger form and tasks
# ---------------------------------------------------------------------------------------
@router.get("/trigger", response_class=HTMLResponse)
def trigger_page(request: Request, job_id: str | None = None, web: WebContext = Ctx) -> HTMLResponse:
    form = {"job_id": job_id} if job_id else {}
    status_rows = web.daemon_status(web.settings.daemons)
    return render_page(request, "trigger.html.j2", status_rows=status_rows, form=form, error=None)


def _int_or_none(name: str, v: str) -> int | None:
    """A form field that holds a positive whole number, or nothing."""
    v = v.strip()
    if not v:
        return None
    if not v.isdigit():
        raise KinetoscopeError(f"{name}: {v!r} is not a positive whole number", exit_code=2)
    return int(v)


@router.post("/trigger")
def trigger_action(
    request: Request,
    hosts: str = Form(""),
    target: str = Form("job"),
    job_id: str = Form(""),
    pids: str = Form(""),
    mode: str = Form("iterations"),
    iterations: str = Form("10"),
    iteration_roundup: str = Form(""),
    duration_ms: str = Form("500"),
    record_shapes: bool = Form(False),
    profile_memory: bool = Form(False),
    with_stack: bool = Form(False),
    with_flops: bool = Form(False),
    with_modules: bool = Form(False),
    include_launchers: bool = Form(False),
    process_limit: str = Form(""),
    output_dir: str = Form(""),
    timeout_s: str = Form("120"),
    analyze: bool = Form(False),
    web: WebContext = Ctx,
) -> Response:
    form = {
        "hosts": hosts, "target": target, "job_id": job_id, "pids": pids, "mode": mode, "iterations": iterations,
        "iteration_roundup": iteration_roundup, "duration_ms": duration_ms, "record_shapes": record_shapes,
        "profile_memory": profile_memory, "with_stack": with_stack, "with_flops": with_flops,
        "with_modules": with_modules, "include_launchers": include_launchers, "process_limit": process_limit,
        "output_dir": output_dir, "timeout_s": timeout_s, "analyze": analyze,
    }  # fmt: skip
    try:
        try:
            timeout = float(timeout_s or 120)
        except ValueError:
            raise KinetoscopeError(f"timeout: {timeout_s!r} is not a number", exit_code=2) from None
        iters = mode == "iterations"
        params = TriggerParams(
            hosts=[h.strip() for h in hosts.split(",") if h.strip()],
            job_id=job_id.strip() if target == "job" else None,
            pids=pids.strip() if target == "pids" else None,
            all=target == "all",
            iterations=_int_or_none("iterations", iterations) if iters else None,
            iteration_roundup=_int_or_none("iteration roundup", iteration_roundup) if iters else None,
            duration_ms=_int_or_none("duration", duration_ms) if mode == "duration" else None,
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
            with_flops=with_flops,
            with_modules=with_modules,
            include_launchers=include_launchers,
            process_limit=_int_or_none("process limit", process_limit),
            output_dir=output_dir.strip() or None,
            timeout_s=timeout,
            analyze=analyze,
        )
        task = web.start_trigger(params)
    except KinetoscopeError as exc:
        status_rows = web.daemon_status(web.settings.daemons)
        return render_page(
            request, "trigger.html.j2", http_status=400, status_rows=status_rows, form=form, error=str(exc)
        )
    return RedirectResponse(f"/tasks/{task.id}", status_code=303)


@router.get("/tasks/{task_id}", response_class=HTMLResponse)
def task_page(request: Request, task_id: str, web: WebContext = Ctx) -> HTMLResponse:
    snap = web.tasks.snapshot(task_id)
    if snap is None:
        raise HTTPException(404, f"no task {task_id!r} (tasks are kept in memory until the server restarts)")
    return render_page(request, "task.html.j2", task=snap)


@router.get("/api", response_class=HTMLResponse)
def api_page(request: Request) -> HTMLResponse:
    schema = request.app.openapi()
    endpoints = []
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            endpoints.append(
                {
                    "method": method.upper(),
                    "path": path,
                    "summary": op.get("summary", ""),
                    "description": (op.get("description") or "").split("\n")[0],
                }
            )
    return render_page(request, "api.html.j2", endpoints=endpoints)
