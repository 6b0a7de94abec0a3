"""Job identity (docs/deploy.md §5): jobs.job_source; trace_files.host_pid and container_pid.

Catalogs written before job identity kept every job outside Slurm as job "0" (libkineto's job
id): those rows cannot be split after the fact (the processes are gone), so they are marked
``job_source = 'unattributed'``; Slurm jobs (a non-zero number) are marked ``slurm``. New traces
record the identity the daemon derived and its source.

Revision ID: 0005_job_identity
Revises: 0004_stacks
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_job_identity"
down_revision = "0004_stacks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("job_source", sa.String(32), nullable=True))
    with op.batch_alter_table("trace_files") as batch:
        batch.add_column(sa.Column("host_pid", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("container_pid", sa.Integer(), nullable=True))
    jobs = sa.table("jobs", sa.column("job_id", sa.String), sa.column("job_source", sa.String))
    op.execute(jobs.update().where(jobs.c.job_id == "0").values(job_source="unattributed"))
    rows = op.get_bind().execute(sa.select(jobs.c.job_id).where(jobs.c.job_source.is_(None))).all()
    slurm = [r.job_id for r in rows if r.job_id.isdigit()]
    if slurm:
        op.execute(jobs.update().where(jobs.c.job_id.in_(slurm)).values(job_source="slurm"))


def downgrade() -> None:
    with op.batch_alter_table("trace_files") as batch:
        batch.drop_column("container_pid")
        batch.drop_column("host_pid")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("job_source")
