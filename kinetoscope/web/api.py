"""The JSON API of ``kscope serve`` under ``/api`` (listed in ``/openapi.json``; docs/web.md).

Catalog reads (jobs, trace requests, analyses and their documents), the configured daemons, and
the two actions: analyse a recorded request, trigger a trace. Actions run as background tasks;
their ``/api/tasks/{id}`` is polled for progress.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import msgspec
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import Response

import kinetoscope
from kinetoscope.protocol.trace_options import field_error
from kinetoscope.web.actions import TriggerParams
from kinetoscope.web.context import WebContext, analysis_links, web_context

router = APIRouter()
Ctx = Depends(web_context)


async def trigger_body(request: Request) -> TriggerParams:
    """The JSON body of ``POST /api/trigger`` as :class:`TriggerParams`, decoded by msgspec with
    the struct's limits: a bad field is a 422 naming it."""
    try:
        body = await request.body()
    except Exception:  # e.g. the body limit stopped it (guards.BodyLimit has answered 413), as FastAPI does
        raise HTTPException(400, "there was an error reading the body") from None
    try:
        return msgspec.json.decode(body, type=TriggerParams)
    except msgspec.ValidationError as exc:
        raise HTTPException(422, field_error(exc)) from None
    except msgspec.DecodeError as exc:
        raise HTTPException(422, f"the body is not JSON: {exc}") from None


# The request body's schema in /openapi.json, generated from the struct (fields, limits, texts).
_TRIGGER_SCHEMA = msgspec.json.schema_components([TriggerParams], ref_template="#/components/schemas/{name}")[
    1
]["TriggerParams"]
TRIGGER_BODY_OPENAPI = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": _TRIGGER_SCHEMA}}}
}


@router.get("/api/health", tags=["meta"], summary="Server, version and catalog")
def api_health(web: WebContext = Ctx) -> dict[str, Any]:
    return {
        "ok": True,
        "version": kinetoscope.__version__,
        "catalog": web.catalog.display_url,
        "daemons": web.settings.daemons,
        "perfetto": web.perfetto is not None,
    }


@router.get("/api/jobs", tags=["catalog"], summary="Jobs, most recently seen first")
def api_jobs(limit: int | None = Query(None, ge=1, le=1_000_000), web: WebContext = Ctx) -> dict[str, Any]:
    return {"jobs": [j.to_dict() for j in web.catalog.jobs(limit=limit)]}


@router.get("/api/jobs/{job_id}", tags=["catalog"], summary="One job with its trace requests")
def api_job(job_id: str, web: WebContext = Ctx) -> dict[str, Any]:
    job = web.catalog.get_job(job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id!r} in the catalog")
    traces = web.catalog.trace_requests(job_id=job_id, limit=None)
    return {"job": job.to_dict(), "traces": [t.to_dict() for t in traces]}


@router.get("/api/traces", tags=["catalog"], summary="Trace requests, newest first")
def api_traces(
    job_id: str | None = None,
    status: str | None = None,
    limit: int = Query(100, ge=1, le=10000),
    web: WebContext = Ctx,
) -> dict[str, Any]:
    traces = web.catalog.trace_requests(job_id=job_id, status=status, limit=limit)
    return {"traces": [t.to_dict() for t in traces]}


@router.get(
    "/api/traces/{trace_id}",
    tags=["catalog"],
    summary="One trace request: files (size, sha256), config, analyses",
)
def api_trace(trace_id: str, web: WebContext = Ctx) -> dict[str, Any]:
    rec = web.trace_or_404(trace_id)
    d = rec.to_dict(with_manifest=True)
    for f in d["files"]:
        f["url"] = f"/traces/{quote(trace_id, safe='')}/files/{quote(f['file'], safe='')}"
    analyses = [a.to_dict(with_document=False) for a in web.catalog.analyses(trace_id=trace_id)]
    return {"trace": d, "analyses": analyses}


@router.post(
    "/api/traces/{trace_id}/analyze",
    tags=["actions"],
    status_code=202,
    summary="Analyse a recorded trace request in the background",
)
def api_analyze(trace_id: str, web: WebContext = Ctx) -> dict[str, Any]:
    return {"task": web.start_analysis(trace_id).to_json()}


@router.get("/api/analyses", tags=["catalog"], summary="Analyses (without their documents), newest first")
def api_analyses(
    trace_id: str | None = None, limit: int = Query(100, ge=1, le=10000), web: WebContext = Ctx
) -> dict[str, Any]:
    out = []
    for a in web.catalog.analyses(trace_id=trace_id, limit=limit):
        d = a.to_dict(with_document=False)
        d["links"] = analysis_links(a)
        out.append(d)
    return {"analyses": out}


@router.get(
    "/api/analyses/{analysis_id}", tags=["catalog"], summary="One analysis (summary fields and links)"
)
def api_analysis(analysis_id: int, web: WebContext = Ctx) -> dict[str, Any]:
    a = web.analysis_or_404(analysis_id)
    d = a.to_dict(with_document=False)
    d["links"] = analysis_links(a)
    return {"analysis": d}


@router.get(
    "/api/analyses/{analysis_id}/document",
    tags=["catalog"],
    summary="The analysis document (kscope analyze --json)",
)
def api_analysis_document(analysis_id: int, web: WebContext = Ctx) -> Response:
    import orjson

    a = web.analysis_or_404(analysis_id)
    return Response(orjson.dumps(a.document), media_type="application/json")


@router.get("/api/daemons", tags=["daemons"], summary="The configured daemons and their registered processes")
def api_daemons(web: WebContext = Ctx) -> dict[str, Any]:
    return {"daemons": web.daemon_status(web.settings.daemons)}


@router.post(
    "/api/trigger",
    tags=["actions"],
    status_code=202,
    summary="Trigger a trace on daemons; poll the task for progress",
    openapi_extra=TRIGGER_BODY_OPENAPI,
)
def api_trigger(params: TriggerParams = Depends(trigger_body), web: WebContext = Ctx) -> dict[str, Any]:
    return {"task": web.start_trigger(params).to_json()}


@router.get("/api/tasks", tags=["actions"], summary="Background tasks of this server (newest first)")
def api_tasks(web: WebContext = Ctx) -> dict[str, Any]:
    return {"tasks": web.tasks.list()}


@router.get(
    "/api/tasks/{task_id}", tags=["actions"], summary="One background task: state, phase, files, links"
)
def api_task(task_id: str, web: WebContext = Ctx) -> dict[str, Any]:
    snap = web.tasks.snapshot(task_id)
    if snap is None:
        raise HTTPException(404, f"no task {task_id!r}")
    return {"task": snap}
