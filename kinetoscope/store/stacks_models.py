"""Catalog table of stack snapshots (``kscope stacks``, the autopilot's hang check, the web
app's "take stacks now"): one row per capture of a job's ranks, with its groups and verdict.

On the catalog's declarative ``Base`` like every table (``schema.py`` gathers every table
module); migration ``migrations/versions/0004_stacks.py``. Columns: docs/stacks.md ("Catalog").
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from kinetoscope.store.models import Base, JSONDoc, UTCDateTime


class JobStacks(Base):
    """One capture: every rank's snapshots, how they group, who the outliers are."""

    __tablename__ = "job_stacks"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    stacks_id: Mapped[str] = mapped_column(sa.String(64), nullable=False, unique=True)
    taken_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, index=True)
    job_id: Mapped[str | None] = mapped_column(sa.String(255), index=True)  # Kineto's / Slurm's job id
    job_key: Mapped[str | None] = mapped_column(sa.String(512), index=True)  # the autopilot's job key
    trigger: Mapped[str] = mapped_column(sa.String(64), nullable=False)  # hang:cpu_idle, web, ...
    hosts: Mapped[list[str]] = mapped_column(JSONDoc, nullable=False)
    ranks: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    groups: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    outliers: Mapped[list[Any]] = mapped_column(JSONDoc, nullable=False)
    states: Mapped[dict[str, int]] = mapped_column(JSONDoc, nullable=False)
    verdict: Mapped[str] = mapped_column(sa.Text, nullable=False)
    document: Mapped[dict[str, Any]] = mapped_column(JSONDoc, nullable=False)


job_stacks: sa.Table = JobStacks.__table__  # type: ignore[assignment]
