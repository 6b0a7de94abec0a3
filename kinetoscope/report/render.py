"""Render the self-contained HTML report (one file, works offline).

* Jinja2 with autoescape on: every string from a trace is escaped in text and attributes.
* Chart data and the whole analysis document are embedded as ``<script type="application/json">``
  through :func:`kinetoscope.report.escape.json_for_script` (``<``, ``>``, ``&`` escaped), read
  back with ``JSON.parse``; chart labels from traces go through ``plotly_text``.
* Plotly's JavaScript (the copy bundled with the ``plotly`` package) is inlined once; no CDN,
  no external fonts, no network access. By default a Content-Security-Policy ``<meta>`` allows
  only the report's own scripts (by nonce) and no network connections at all.
"""

from __future__ import annotations

import functools
import os
import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2

import kinetoscope
from kinetoscope.errors import KinetoscopeError
from kinetoscope.report.escape import js_for_script, json_for_script
from kinetoscope.report.sections import build_view
from kinetoscope.units import fmt_bytes

_HERE = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=1)
def plotly_js() -> str:
    """The plotly.js bundle shipped inside the ``plotly`` Python package (no network)."""
    try:
        from importlib.resources import files

        return (files("plotly") / "package_data" / "plotly.min.js").read_text(encoding="utf-8")
    except (FileNotFoundError, ModuleNotFoundError, OSError):  # pragma: no cover - other layouts
        from plotly.offline import get_plotlyjs

        js: str = get_plotlyjs()  # untyped in plotly
        return js


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_HERE / "templates")),
        autoescape=True,  # every template, whatever its extension
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["bytes"] = fmt_bytes
    return env


def _read_static(name: str) -> str:
    return (_HERE / "templates" / name).read_text(encoding="utf-8")


def render_report(
    document: Mapping[str, Any],
    *,
    title: str | None = None,
    inputs: Sequence[str] = (),
    generated_at: datetime | None = None,
    max_rows: int = 50,
    csp: bool = True,
    nonce: str | None = None,
    embed_document: bool = True,
    links: Mapping[str, str] | None = None,
    plotly_src: str | None = None,
) -> str:
    """The HTML report of an analysis document (``kscope analyze --json`` /
    ``kinetoscope.analysis.runner.build_document``) as one string.

    ``inputs``: what was analysed (shown in the header). ``max_rows``: rows per table (the rest
    stays in the embedded JSON document). ``csp``: add a Content-Security-Policy ``<meta>``
    (scripts only by ``nonce``; no network). ``embed_document``: include the whole document
    (downloadable from the report). ``links``: extra header links (label -> same-site URL), used by
    the web app. ``plotly_src``: load plotly.js from this same-site URL instead of inlining it
    (the web app serves it once, cacheable); the report is then no longer self-contained."""
    view = build_view(document, title=title, inputs=inputs, max_rows=max_rows)
    nonce = nonce or secrets.token_urlsafe(16)
    charts = {c.id: {"figure": c.figure, "height": c.height} for s in view.sections for c in s.charts}
    generated = (generated_at or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M:%S UTC")
    html = (
        _env()
        .get_template("report.html.j2")
        .render(
            view=view,
            nonce=nonce,
            csp=csp,
            version=kinetoscope.__version__,
            generated=generated,
            charts_json=json_for_script(charts),
            document_json=json_for_script(document) if embed_document else None,
            plotly_js=None if plotly_src else js_for_script(plotly_js()),
            plotly_src=plotly_src,
            report_js=js_for_script(_read_static("report.js")),
            report_css=_read_static("report.css"),
            links=dict(links or {}),
        )
    )
    return html


class ReportWriteError(KinetoscopeError):
    """The report file cannot be written where asked (the message names the path and why)."""


def check_output_path(path: str | os.PathLike[str]) -> Path:
    """Refuse, before any work, an output path that cannot be a report file: an existing folder,
    or a folder that cannot be created or written. Raises :class:`ReportWriteError` (one line)."""
    out = Path(path)
    if out.is_dir():
        raise ReportWriteError(
            f"cannot write the report to {out}: it is a directory (give a file name, "
            f"e.g. {out / 'report.html'})"
        )
    parent = out.parent
    if parent.exists() and not parent.is_dir():
        raise ReportWriteError(f"cannot write the report to {out}: {parent} is a file, not a folder")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportWriteError(f"cannot write the report to {out}: {_os_reason(exc)}") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ReportWriteError(f"cannot write the report to {out}: folder {parent} is not writable")
    return out


def write_report(document: Mapping[str, Any], path: str | os.PathLike[str], **kwargs: Any) -> Path:
    """``render_report`` written atomically to ``path`` (a temporary file in the same folder,
    then renamed). Returns the path. Raises :class:`ReportWriteError` (one line) when the file
    cannot be written: a folder in the way, a read-only file system, no space, ..."""
    out = check_output_path(path)
    html = render_report(document, **kwargs)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(html, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        raise ReportWriteError(f"cannot write the report to {out}: {_os_reason(exc)}") from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # the folder refused the file in the first place
    return out


def _os_reason(exc: OSError) -> str:
    """``Read-only file system`` rather than ``[Errno 30] Read-only file system: '/x/.r.html.tmp-1'``."""
    return exc.strerror or str(exc)
