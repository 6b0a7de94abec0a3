"""Reading and writing ``job_stacks`` (``stacks_models``): record a capture, find the latest of a
job. The document is the ``kscope stacks --json`` document (docs/stacks.md), kept whole."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa

from kinetoscope.store.catalog import Catalog
from kinetoscope.store.stacks_models import job_stacks


def new_stacks_id(now: datetime | None = None) -> str:
    """``stk-YYYYmmdd-HHMMSS-<8 hex>`` (UTC)."""
    now = now or datetime.now(timezone.utc)
    return f"stk-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(4)}"


def record_stacks(
    catalog: Catalog,
    document: Mapping[str, Any],
    *,
    trigger: str,
    job_id: str | None = None,
    job_key: str | None = None,
) -> dict[str, Any]:
    """Insert one capture (``document``: a stacks report's JSON); returns the row as a dict."""
    now = datetime.now(timezone.utc)
    groups = document.get("groups") or []
    row = {
        "stacks_id": new_stacks_id(now),
        "taken_at": now,
        "job_id": job_id,
        "job_key": job_key,
        "trigger": trigger[:64],
        "hosts": [str(h.get("host")) for h in document.get("hosts") or [] if isinstance(h, dict)],
        "ranks": len(document.get("ranks") or []),
        "groups": len(groups),
        "outliers": list(document.get("outliers") or []),
        "states": dict(document.get("states") or {}),
        "verdict": str(document.get("verdict") or ""),
        "document": dict(document),
    }
    with catalog._write() as conn:
        res = conn.execute(job_stacks.insert().values(**row))
        pk = res.inserted_primary_key
    return {"id": int(pk[0]) if pk else None, **row}


def latest_stacks(
    catalog: Catalog, *, job_id: str | None = None, job_key: str | None = None, limit: int = 1
) -> list[dict[str, Any]]:
    """The newest captures of a job (by job id or job key), newest first."""
    query = sa.select(job_stacks).order_by(job_stacks.c.taken_at.desc(), job_stacks.c.id.desc()).limit(limit)
    if job_id is not None:
        query = query.where(job_stacks.c.job_id == job_id)
    if job_key is not None:
        query = query.where(job_stacks.c.job_key == job_key)
    with catalog._read() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def get_stacks(catalog: Catalog, stacks_id: str) -> dict[str, Any] | None:
    with catalog._read() as conn:
        row = conn.execute(sa.select(job_stacks).where(job_stacks.c.stacks_id == stacks_id)).first()
    return dict(row._mapping) if row else None
