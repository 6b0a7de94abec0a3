"""The catalog schema (SQLAlchemy 2 ORM). Migrations in ``migrations/versions`` must match it
(``tests/store/test_migrations.py`` checks that autogenerate finds no difference)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: JSON documents: JSONB on PostgreSQL, JSON text on SQLite.
JSONDoc = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in and out on every backend (SQLite keeps no zone: stored as UTC)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        value = value.astimezone(timezone.utc)
        if dialect.name == "sqlite":
            value = value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING)


class Job(Base):
    __tablename__ = "jobs"

    job_id: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    hosts: Mapped[list[str]] = mapped_column(JSONDoc, nullable=False)
    world_size: Mapped[int | None] = mapped_column(sa.Integer)
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, index=True)
    cmdline: Mapped[str | None] = mapped_column(sa.Text)
    # where the job identity came from (protocol/jobident.SOURCES; "unattributed": job "0" of a
    # catalog older than job identity, migration 0003)
    job_source: Mapped[str | None] = mapped_column(sa.String(32))


class TraceRequest(Base):
    __tablename__ = "trace_requests"

    trace_id: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    created: Mapped[datetime | None] = mapped_column(UTCDateTime, index=True)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    config: Mapped[str | None] = mapped_column(sa.Text)
    requested_by: Mapped[str | None] = mapped_column(sa.String(255))
    hosts: Mapped[list[str]] = mapped_column(JSONDoc, nullable=False)
    job_ids: Mapped[list[str]] = mapped_column(JSONDoc, nullable=False)
    status: Mapped[str] = mapped_column(sa.String(32), nullable=False)
    file_count: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    complete_files: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    total_bytes: Mapped[int] = mapped_column(sa.BigInteger, nullable=False)
    store_url: Mapped[str | None] = mapped_column(sa.Text)
    manifest: Mapped[dict[str, Any]] = mapped_column(JSONDoc, nullable=False)


class TraceFile(Base):
    __tablename__ = "trace_files"
    __table_args__ = (sa.UniqueConstraint("trace_id", "file"),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    trace_id: Mapped[str] = mapped_column(
        sa.String(255), sa.ForeignKey("trace_requests.trace_id", ondelete="CASCADE"), nullable=False
    )
    file: Mapped[str] = mapped_column(sa.String(1024), nullable=False)
    path: Mapped[str | None] = mapped_column(sa.Text)
    host: Mapped[str | None] = mapped_column(sa.String(255))
    pid: Mapped[int | None] = mapped_column(sa.Integer)
    rank: Mapped[int | None] = mapped_column(sa.Integer)
    local_rank: Mapped[int | None] = mapped_column(sa.Integer)
    world_size: Mapped[int | None] = mapped_column(sa.Integer)
    job_id: Mapped[str | None] = mapped_column(sa.String(255), index=True)
    cmdline: Mapped[str | None] = mapped_column(sa.Text)
    iterations: Mapped[int | None] = mapped_column(sa.Integer)
    duration_ms: Mapped[float | None] = mapped_column(sa.Float)
    bytes: Mapped[int | None] = mapped_column(sa.BigInteger)
    sha256: Mapped[str | None] = mapped_column(sa.String(64))
    storage_url: Mapped[str | None] = mapped_column(sa.Text)
    complete: Mapped[bool | None] = mapped_column(sa.Boolean)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    host_pid: Mapped[int | None] = mapped_column(sa.Integer)  # the daemon's view of ``pid``
    container_pid: Mapped[int | None] = mapped_column(sa.Integer)  # set for a process in a container


class Analysis(Base):
    __tablename__ = "analyses"
    __table_args__ = (sa.UniqueConstraint("inputs_key", "name", "version", "document_sha256"),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    trace_id: Mapped[str | None] = mapped_column(
        sa.String(255), sa.ForeignKey("trace_requests.trace_id", ondelete="SET NULL"), index=True
    )
    inputs: Mapped[list[str]] = mapped_column(JSONDoc, nullable=False)
    inputs_key: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    name: Mapped[str] = mapped_column(sa.String(255), nullable=False)
    version: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    created: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, index=True)
    document_sha256: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    document: Mapped[dict[str, Any]] = mapped_column(JSONDoc, nullable=False)
    summary: Mapped[dict[str, Any]] = mapped_column(JSONDoc, nullable=False)
    step_time_ms: Mapped[float | None] = mapped_column(sa.Float)
    straggler_kind: Mapped[str | None] = mapped_column(sa.String(64))
    straggler_rank: Mapped[int | None] = mapped_column(sa.Integer)
    world_size: Mapped[int | None] = mapped_column(sa.Integer)


# (SQLAlchemy types ``__table__`` as the FromClause base; a declared class's is a Table)
jobs = cast(sa.Table, Job.__table__)
trace_requests = cast(sa.Table, TraceRequest.__table__)
trace_files = cast(sa.Table, TraceFile.__table__)
analyses = cast(sa.Table, Analysis.__table__)
