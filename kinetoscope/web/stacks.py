"""The job page's stacks: "Take stacks now" (``POST /jobs/{job_id}/stacks``) asks the web app's
daemons for every rank's Python stack (``kscope stacks``), records the capture in the catalog
and shows the job page again; ``GET /api/jobs/{job_id}/stacks`` gives the latest captures as
JSON (docs/stacks.md, docs/web.md)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse, Response

from kinetoscope.errors import KinetoscopeError
from kinetoscope.web.context import WebContext, web_context

router = APIRouter()
Ctx = Depends(web_context)
WEB_SAMPLES = 2  # two snapshots a second apart: stuck or progressing


def latest_for_job(web: WebContext, job_id: str, limit: int = 1) -> list[dict[str, Any]]:
    """The newest stack captures of a catalog job (for the job page)."""
    from kinetoscope.store.stacks_store import latest_stacks

    return latest_stacks(web.catalog, job_id=job_id, limit=limit)


@router.post("/jobs/{job_id}/stacks", include_in_schema=False)
def take_stacks_action(request: Request, job_id: str, web: WebContext = Ctx) -> Response:
    from kinetoscope.collect.stacks import parse_stacks_request, take_stacks
    from kinetoscope.store.stacks_store import record_stacks
    from kinetoscope.web.pages import error_page

    try:
        stacks_request, _notes = parse_stacks_request(
            hosts=list(web.settings.daemons) or None, job_id=job_id, samples=WEB_SAMPLES
        )
        report = take_stacks(stacks_request, token=web.settings.token)
    except KinetoscopeError as exc:
        return error_page(request, 400, "Cannot take stacks", str(exc))
    if not report.ranks:
        why = "; ".join(str(e.get("message")) for e in report.errors) or "no process matched"
        return error_page(request, 502, "No stacks", why)
    record_stacks(web.catalog, report, trigger="web", job_id=job_id)
    return RedirectResponse(f"/jobs/{job_id}#stacks", status_code=303)


@router.get("/api/jobs/{job_id}/stacks", tags=["stacks"])
def stacks_api(job_id: str, limit: int = 1, web: WebContext = Ctx) -> dict[str, Any]:
    """The newest stack captures of a job (``kscope stacks --json`` documents, with when and why)."""
    rows = latest_for_job(web, job_id, max(1, min(limit, 50)))
    for r in rows:
        r["taken_at"] = r["taken_at"].strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"job_id": job_id, "stacks": rows}
