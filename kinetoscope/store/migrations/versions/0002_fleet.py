"""Fleet autopilot: fleet_hosts, fleet_jobs, fleet_samples, fleet_alerts (docs/autopilot.md).

Revision ID: 0002_fleet
Revises: 0001_initial
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from kinetoscope.store.models import JSONDoc, UTCDateTime

revision = "0002_fleet"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fleet_hosts",
        sa.Column("address", sa.String(255), nullable=False),
        sa.Column("hostname", sa.String(255), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("last_ok", UTCDateTime(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("next_retry", UTCDateTime(), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("announced", UTCDateTime(), nullable=True),
        sa.Column("devices", sa.Integer(), nullable=True),
        sa.Column("version", sa.String(64), nullable=True),
        sa.PrimaryKeyConstraint("address", name=op.f("pk_fleet_hosts")),
    )
    op.create_table(
        "fleet_jobs",
        sa.Column("job_key", sa.String(512), nullable=False),
        sa.Column("job_id", sa.String(255), nullable=True),
        sa.Column("cmdline", sa.Text(), nullable=True),
        sa.Column("hosts", JSONDoc, nullable=False),
        sa.Column("ranks", JSONDoc, nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=True),
        sa.Column("devices", sa.Integer(), nullable=False),
        sa.Column("opted_out", sa.Boolean(), nullable=False),
        sa.Column("first_seen", UTCDateTime(), nullable=False),
        sa.Column("last_seen", UTCDateTime(), nullable=False),
        sa.Column("ended_at", UTCDateTime(), nullable=True),
        sa.Column("age_s", sa.Float(), nullable=True),
        sa.Column("next_due", UTCDateTime(), nullable=True),
        sa.Column("lease_owner", sa.String(255), nullable=True),
        sa.Column("lease_expires", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("job_key", name=op.f("pk_fleet_jobs")),
    )
    op.create_index(op.f("ix_fleet_jobs_last_seen"), "fleet_jobs", ["last_seen"])
    op.create_table(
        "fleet_samples",
        sa.Column("sample_id", sa.String(255), nullable=False),
        sa.Column("job_key", sa.String(512), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("reason", sa.String(64), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("hosts", JSONDoc, nullable=False),
        sa.Column("request", JSONDoc, nullable=False),
        sa.Column("analysis_id", sa.Integer(), nullable=True),
        sa.Column("interval_s", sa.Float(), nullable=True),
        sa.Column("devices", sa.Integer(), nullable=True),
        sa.Column("gpu_busy_pct", sa.Float(), nullable=True),
        sa.Column("mfu", sa.Float(), nullable=True),
        sa.Column("straggler_kind", sa.String(64), nullable=True),
        sa.Column("straggler_ranks", JSONDoc, nullable=True),
        sa.Column("lost_fraction", sa.Float(), nullable=True),
        sa.Column("exposed_comm_pct", sa.Float(), nullable=True),
        sa.Column("launch_bound_pct", sa.Float(), nullable=True),
        sa.Column("top_recommendation", sa.String(128), nullable=True),
        sa.Column("wasted_gpu_s", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_key"],
            ["fleet_jobs.job_key"],
            ondelete="CASCADE",
            name=op.f("fk_fleet_samples_job_key_fleet_jobs"),
        ),
        sa.PrimaryKeyConstraint("sample_id", name=op.f("pk_fleet_samples")),
    )
    op.create_index(op.f("ix_fleet_samples_job_key"), "fleet_samples", ["job_key"])
    op.create_index(op.f("ix_fleet_samples_state"), "fleet_samples", ["state"])
    op.create_index(op.f("ix_fleet_samples_created"), "fleet_samples", ["created"])
    op.create_table(
        "fleet_alerts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_key", sa.String(512), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("sample_id", sa.String(255), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("threshold", sa.Float(), nullable=True),
        sa.Column("opened", UTCDateTime(), nullable=False),
        sa.Column("closed", UTCDateTime(), nullable=True),
        sa.Column("sent", UTCDateTime(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_key"],
            ["fleet_jobs.job_key"],
            ondelete="CASCADE",
            name=op.f("fk_fleet_alerts_job_key_fleet_jobs"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fleet_alerts")),
    )
    op.create_index(op.f("ix_fleet_alerts_job_key"), "fleet_alerts", ["job_key"])


def downgrade() -> None:
    op.drop_table("fleet_alerts")
    op.drop_table("fleet_samples")
    op.drop_table("fleet_jobs")
    op.drop_table("fleet_hosts")
