"""Reading and writing ``job_stacks`` (``stacks_models``): record a capture, find the latest of a
job. The document is the ``kscope stacks --json`` document (docs/stacks.md), kept whole."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, Protocol

import sqlalchemy as sa

from kinetoscope.store.catalog import Catalog
from kinetoscope.store.stacks_models import job_stacks


def new_stacks_id(now: datetime | None = None) -> str:
    """``stk-YYYYmmdd-HHMMSS-<8 hex>`` (UTC)."""
    now = now or datetime.now(timezone.utc)
    return f"stk-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(4)}"


class StacksCapture(Protocol):
    """What :func:`record_stacks` reads of a stacks report: ``collect.stack_groups.StacksReport``
    is one. ``store`` sits below ``collect`` (and ``document``) in the layers, so it names the
    attributes it reads instead of importing the class: the report's typed fields, not its JSON."""

    @property
    def hosts(self) -> Sequence[Mapping[str, object]]: ...

    @property
    def ranks(self) -> Sequence[object]: ...

    @property
    def groups(self) -> Sequence[object]: ...

    @property
    def outliers(self) -> Sequence[int | None]: ...

    @property
    def states(self) -> Mapping[str, int]: ...

    @property
    def verdict(self) -> str: ...

    def to_json(self) -> dict[str, object]:
        """The ``kscope stacks --json`` document, kept whole in the row."""
        ...


def record_stacks(
    catalog: Catalog,
    report: StacksCapture,
    *,
    trigger: str,
    job_id: str | None = None,
    job_key: str | None = None,
) -> dict[str, Any]:
    """Insert one capture (``report``: a stacks report; its JSON is kept as ``document``);
    returns the row as a dict."""
    now = datetime.now(timezone.utc)
    row = {
        "stacks_id": new_stacks_id(now),
        "taken_at": now,
        "job_id": job_id,
        "job_key": job_key,
        "trigger": trigger[:64],
        "hosts": [str(h["host"] if "host" in h else None) for h in report.hosts],
        "ranks": len(report.ranks),
        "groups": len(report.groups),
        "outliers": list(report.outliers),
        "states": dict(report.states),
        "verdict": str(report.verdict or ""),
        "document": report.to_json(),
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
