"""Catalog tables of the fleet autopilot (``kscope autopilot``): hosts, jobs, samples, alerts.

They live on the catalog's declarative ``Base`` (so alembic sees one schema and
``tests/store/test_migrations.py`` checks them too); ``schema.py`` gathers every table module.
Migrations: ``migrations/versions/0002_fleet.py``, ``0003_fleet_evidence.py``. Meaning of every column: docs/autopilot.md.

Terms:

* **job key** — the autopilot's identity of a job across hosts: ``slurm:<SLURM_JOB_ID>``, else
  ``torch:<MASTER_ADDR>:<MASTER_PORT>:<TORCHELASTIC_RUN_ID>`` for a distributed job, else
  ``proc:<hostname>:<pid>`` for a single process (Kineto's own job id is ``0`` for every job
  outside Slurm, so it cannot tell jobs apart).
* **sample** — one automatic trace of a job and its diagnosis summary; its ``state`` moves
  ``planned`` → ``triggered`` → ``recorded`` (or ``unusable`` / ``failed`` / ``job_ended``), and its id is the
  trace id, chosen before the trigger so a restarted autopilot can find the trace again.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from kinetoscope.store.models import Base, JSONDoc, UTCDateTime


class FleetHost(Base):
    """A daemon the autopilot asks (``--host``): reachability and retry back-off."""

    __tablename__ = "fleet_hosts"

    address: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    hostname: Mapped[str | None] = mapped_column(sa.String(255))
    status: Mapped[str] = mapped_column(sa.String(16), nullable=False)  # up | down
    failures: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    last_ok: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_error: Mapped[str | None] = mapped_column(sa.Text)
    next_retry: Mapped[datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    announced: Mapped[datetime | None] = mapped_column(
        UTCDateTime
    )  # last heartbeat of `kscope daemon --catalog`
    devices: Mapped[int | None] = mapped_column(sa.Integer)  # GPUs the daemon sees (NVML)
    version: Mapped[str | None] = mapped_column(sa.String(64))


class FleetJob(Base):
    """A job seen by discovery, its schedule and the lease that keeps two autopilots apart."""

    __tablename__ = "fleet_jobs"

    job_key: Mapped[str] = mapped_column(sa.String(512), primary_key=True)
    job_id: Mapped[str | None] = mapped_column(sa.String(255))
    cmdline: Mapped[str | None] = mapped_column(sa.Text)
    hosts: Mapped[list[str]] = mapped_column(JSONDoc, nullable=False)
    ranks: Mapped[list[dict[str, Any]]] = mapped_column(JSONDoc, nullable=False)
    world_size: Mapped[int | None] = mapped_column(sa.Integer)
    devices: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    opted_out: Mapped[bool] = mapped_column(sa.Boolean, nullable=False)
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, index=True)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    age_s: Mapped[float | None] = mapped_column(sa.Float)
    next_due: Mapped[datetime | None] = mapped_column(UTCDateTime)
    lease_owner: Mapped[str | None] = mapped_column(sa.String(255))
    lease_expires: Mapped[datetime | None] = mapped_column(UTCDateTime)


class FleetSample(Base):
    """One automatic trace of a job and the summary of its diagnosis."""

    __tablename__ = "fleet_samples"

    sample_id: Mapped[str] = mapped_column(sa.String(255), primary_key=True)  # = trace id
    job_key: Mapped[str] = mapped_column(
        sa.String(512), sa.ForeignKey("fleet_jobs.job_key", ondelete="CASCADE"), nullable=False, index=True
    )
    owner: Mapped[str] = mapped_column(sa.String(255), nullable=False)
    state: Mapped[str] = mapped_column(sa.String(32), nullable=False, index=True)
    reason: Mapped[str | None] = mapped_column(sa.String(64))
    error: Mapped[str | None] = mapped_column(sa.Text)
    created: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    hosts: Mapped[list[str]] = mapped_column(JSONDoc, nullable=False)
    request: Mapped[dict[str, Any]] = mapped_column(JSONDoc, nullable=False)
    analysis_id: Mapped[int | None] = mapped_column(sa.Integer)
    interval_s: Mapped[float | None] = mapped_column(sa.Float)
    devices: Mapped[int | None] = mapped_column(sa.Integer)
    gpu_busy_pct: Mapped[float | None] = mapped_column(sa.Float)
    mfu: Mapped[float | None] = mapped_column(sa.Float)
    straggler_kind: Mapped[str | None] = mapped_column(sa.String(64))
    straggler_ranks: Mapped[list[int] | None] = mapped_column(JSONDoc)
    lost_fraction: Mapped[float | None] = mapped_column(sa.Float)
    exposed_comm_pct: Mapped[float | None] = mapped_column(sa.Float)
    launch_bound_pct: Mapped[float | None] = mapped_column(sa.Float)
    top_recommendation: Mapped[str | None] = mapped_column(sa.String(128))
    wasted_gpu_s: Mapped[float | None] = mapped_column(sa.Float)
    # kernels stamped before their launch etc. (repeated profiling); migration 0003
    timestamp_anomalies: Mapped[int | None] = mapped_column(sa.Integer)
    evidence: Mapped[dict[str, Any] | None] = mapped_column(JSONDoc)  # autopilot.evidence.SampleEvidence
    top_recommendation_title: Mapped[str | None] = mapped_column(sa.String(256))


class FleetAlert(Base):
    """One alert episode: a job over a threshold from ``opened`` until a sample is back under it."""

    __tablename__ = "fleet_alerts"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    job_key: Mapped[str] = mapped_column(
        sa.String(512), sa.ForeignKey("fleet_jobs.job_key", ondelete="CASCADE"), nullable=False, index=True
    )
    kind: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    sample_id: Mapped[str] = mapped_column(sa.String(255), nullable=False)
    value: Mapped[float | None] = mapped_column(sa.Float)
    threshold: Mapped[float | None] = mapped_column(sa.Float)
    opened: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    closed: Mapped[datetime | None] = mapped_column(UTCDateTime)
    sent: Mapped[datetime | None] = mapped_column(UTCDateTime)
    attempts: Mapped[int] = mapped_column(sa.Integer, nullable=False)


fleet_hosts: sa.Table = FleetHost.__table__  # type: ignore[assignment]
fleet_jobs: sa.Table = FleetJob.__table__  # type: ignore[assignment]
fleet_samples: sa.Table = FleetSample.__table__  # type: ignore[assignment]
fleet_alerts: sa.Table = FleetAlert.__table__  # type: ignore[assignment]
