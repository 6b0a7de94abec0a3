"""Stack snapshots: job_stacks (docs/stacks.md).

Revision ID: 0004_stacks
Revises: 0003_fleet_evidence
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from kinetoscope.store.models import JSONDoc, UTCDateTime

revision = "0004_stacks"
down_revision = "0003_fleet_evidence"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_stacks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("stacks_id", sa.String(64), nullable=False),
        sa.Column("taken_at", UTCDateTime(), nullable=False),
        sa.Column("job_id", sa.String(255), nullable=True),
        sa.Column("job_key", sa.String(512), nullable=True),
        sa.Column("trigger", sa.String(64), nullable=False),
        sa.Column("hosts", JSONDoc, nullable=False),
        sa.Column("ranks", sa.Integer(), nullable=False),
        sa.Column("groups", sa.Integer(), nullable=False),
        sa.Column("outliers", JSONDoc, nullable=False),
        sa.Column("states", JSONDoc, nullable=False),
        sa.Column("verdict", sa.Text(), nullable=False),
        sa.Column("document", JSONDoc, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_stacks")),
        sa.UniqueConstraint("stacks_id", name=op.f("uq_job_stacks_stacks_id")),
    )
    op.create_index(op.f("ix_job_stacks_taken_at"), "job_stacks", ["taken_at"])
    op.create_index(op.f("ix_job_stacks_job_id"), "job_stacks", ["job_id"])
    op.create_index(op.f("ix_job_stacks_job_key"), "job_stacks", ["job_key"])


def downgrade() -> None:
    op.drop_table("job_stacks")
