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
import msgspec
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

import kinetoscope
from kinetoscope.errors import KinetoscopeError
from kinetoscope.protocol.trace_options import TraceOptions, field_descriptions
from kinetoscope.units import fmt_bytes, fmt_datetime, fmt_fixed
from kinetoscope.web.actions import TriggerParams, decode_params
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
    return render_page(
        request, "trigger.html.j2", status_rows=status_rows, form=form, option_flags=OPTION_FLAGS, error=None
    )


# What an empty form means: the template's defaults (a form posted without a field gets these;
# "align" has no checkbox on the form: always aligned, as `kscope trace` without --no-align).
FORM_DEFAULTS = {
    "align": "true",
    "target": "job",
    "mode": "iterations",
    "iterations": "10",
    "duration_ms": "500",
    "timeout_s": "120",
}
# The form's radio buttons: which fields each choice uses (the others' inputs are ignored).
_MODE_FIELDS = {"iterations": ("iterations", "iteration_roundup"), "duration": ("duration_ms",)}
_TARGET_FIELDS = {"job": ("job_id",), "pids": ("pids",), "all": ()}


def _base_type(t: msgspec.inspect.Type) -> msgspec.inspect.Type:
    """The type under ``Optional`` and ``Annotated`` (what a form field's text must become)."""
    if isinstance(t, msgspec.inspect.Metadata):
        return _base_type(t.type)
    if isinstance(t, msgspec.inspect.UnionType):
        inner = [x for x in t.types if not isinstance(x, msgspec.inspect.NoneType)]
        return _base_type(inner[0]) if len(inner) == 1 else t
    return t


def _form_value(name: str, t: msgspec.inspect.Type, raw: str) -> Any:
    """A form field's text as the struct's field type; None for an empty field."""
    kind, raw, label = _base_type(t), raw.strip(), name.replace("_", " ")
    if isinstance(kind, msgspec.inspect.BoolType):
        return raw.lower() in ("true", "on", "1", "yes")
    if isinstance(kind, msgspec.inspect.ListType):
        return [h.strip() for h in raw.split(",") if h.strip()]
    if not raw:
        return None
    if isinstance(kind, msgspec.inspect.IntType):
        if not raw.isdigit():
            raise KinetoscopeError(f"{label}: {raw!r} is not a positive whole number", exit_code=2)
        return int(raw)
    if isinstance(kind, msgspec.inspect.FloatType):
        try:
            return float(raw)
        except ValueError:
            raise KinetoscopeError(f"{label}: {raw!r} is not a number", exit_code=2) from None
    return raw


def _struct_fields(kind: type[msgspec.Struct]) -> list[msgspec.inspect.Field]:
    info = msgspec.inspect.type_info(kind)
    assert isinstance(info, msgspec.inspect.StructType)
    return list(info.fields)


# The form's option checkboxes: the boolean trace options, labelled by their descriptions.
OPTION_FLAGS = [
    (f.name, field_descriptions(TraceOptions)[f.name])
    for f in _struct_fields(TraceOptions)
    if isinstance(_base_type(f.type), msgspec.inspect.BoolType)
]


def params_from_form(form: dict[str, str]) -> TriggerParams:
    """The trigger form as :class:`TriggerParams`, field by field from the struct's own types
    (no field is written out here): the ``target`` and ``mode`` radios choose which inputs count."""
    mode, target = form.get("mode", "iterations"), form.get("target", "job")
    ignored = {n for m, names in _MODE_FIELDS.items() if m != mode for n in names}
    ignored |= {n for t, names in _TARGET_FIELDS.items() if t != target for n in names}
    fields: dict[str, Any] = {"all": target == "all"}
    for f in _struct_fields(TriggerParams):
        if f.name in ignored or f.name == "all":
            continue
        value = _form_value(f.name, f.type, form.get(f.name, FORM_DEFAULTS.get(f.name, "")))
        if value is not None:
            fields[f.name] = value
    return decode_params(fields)


async def _form_fields(request: Request) -> dict[str, str]:
    """The posted form's text fields."""
    try:
        form = await request.form()
    except Exception:  # e.g. the body limit stopped it (guards.BodyLimit has answered 413), as FastAPI does
        raise HTTPException(400, "there was an error reading the form") from None
    return {k: v for k, v in form.items() if isinstance(v, str)}


@router.post("/trigger")
def trigger_action(
    request: Request, form: dict[str, str] = Depends(_form_fields), web: WebContext = Ctx
) -> Response:
    try:
        task = web.start_trigger(params_from_form(form))
    except KinetoscopeError as exc:
        status_rows = web.daemon_status(web.settings.daemons)
        return render_page(
            request,
            "trigger.html.j2",
            http_status=400,
            status_rows=status_rows,
            form=form,
            option_flags=OPTION_FLAGS,
            error=str(exc),
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
