"""Initial catalog: jobs, trace_requests, trace_files, analyses.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from kinetoscope.store.models import JSONDoc, UTCDateTime

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("job_id", sa.String(255), nullable=False),
        sa.Column("hosts", JSONDoc, nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=True),
        sa.Column("first_seen", UTCDateTime(), nullable=False),
        sa.Column("last_seen", UTCDateTime(), nullable=False),
        sa.Column("cmdline", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_jobs")),
    )
    op.create_index(op.f("ix_jobs_last_seen"), "jobs", ["last_seen"])

    op.create_table(
        "trace_requests",
        sa.Column("trace_id", sa.String(255), nullable=False),
        sa.Column("created", UTCDateTime(), nullable=True),
        sa.Column("recorded_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("config", sa.Text(), nullable=True),
        sa.Column("requested_by", sa.String(255), nullable=True),
        sa.Column("hosts", JSONDoc, nullable=False),
        sa.Column("job_ids", JSONDoc, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("file_count", sa.Integer(), nullable=False),
        sa.Column("complete_files", sa.Integer(), nullable=False),
        sa.Column("total_bytes", sa.BigInteger(), nullable=False),
        sa.Column("store_url", sa.Text(), nullable=True),
        sa.Column("manifest", JSONDoc, nullable=False),
        sa.PrimaryKeyConstraint("trace_id", name=op.f("pk_trace_requests")),
    )
    op.create_index(op.f("ix_trace_requests_created"), "trace_requests", ["created"])

    op.create_table(
        "trace_files",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("trace_id", sa.String(255), nullable=False),
        sa.Column("file", sa.String(1024), nullable=False),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("host", sa.String(255), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("local_rank", sa.Integer(), nullable=True),
        sa.Column("world_size", sa.Integer(), nullable=True),
        sa.Column("job_id", sa.String(255), nullable=True),
        sa.Column("cmdline", sa.Text(), nullable=True),
        sa.Column("iterations", sa.Integer(), nullable=True),
        sa.Column("duration_ms", sa.Float(), nullable=True),
        sa.Column("bytes", sa.BigInteger(), nullable=True),
        sa.Column("sha256", sa.String(64), nullable=True),
        sa.Column("storage_url", sa.Text(), nullable=True),
        sa.Column("complete", sa.Boolean(), nullable=True),
        sa.Column("recorded_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["trace_id"],
            ["trace_requests.trace_id"],
            ondelete="CASCADE",
            name=op.f("fk_trace_files_trace_id_trace_requests"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trace_files")),
        sa.UniqueConstraint("trace_id", "file", name=op.f("uq_trace_files_trace_id_file")),
    )
    op.create_index(op.f("ix_trace_files_job_id"), "trace_files", ["job_id"])

    op.create_table(
        "analyses",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("trace_id", sa.String(255), nullable=True),
        sa.Column("inputs", JSONDoc, nullable=False),
        sa.Column("inputs_key", sa.String(64), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("created", UTCDateTime(), nullable=False),
        sa.Column("document_sha256", sa.String(64), nullable=False),
        sa.Column("document", JSONDoc, nullable=False),
        sa.Column("summary", JSONDoc, nullable=False),
        sa.Column("step_time_ms", sa.Float(), nullable=True),
        sa.Column("straggler_kind", sa.String(64), nullable=True),
        sa.Column("straggler_rank", sa.Integer(), nullable=True),
        sa.Column("world_size", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["trace_id"],
            ["trace_requests.trace_id"],
            ondelete="SET NULL",
            name=op.f("fk_analyses_trace_id_trace_requests"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_analyses")),
        sa.UniqueConstraint(
            "inputs_key",
            "name",
            "version",
            "document_sha256",
            name=op.f("uq_analyses_inputs_key_name_version_document_sha256"),
        ),
    )
    op.create_index(op.f("ix_analyses_trace_id"), "analyses", ["trace_id"])
    op.create_index(op.f("ix_analyses_created"), "analyses", ["created"])


def downgrade() -> None:
    op.drop_table("analyses")
    op.drop_table("trace_files")
    op.drop_table("trace_requests")
    op.drop_table("jobs")
