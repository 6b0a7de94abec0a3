"""Fleet autopilot: each sample's evidence (is its trace fit for a verdict, and why not) and its
count of timestamp anomalies, and the title of its top
recommendation (docs/autopilot.md, "Sample evidence").

Revision ID: 0003_fleet_evidence
Revises: 0002_fleet
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from kinetoscope.store.models import JSONDoc

revision = "0003_fleet_evidence"
down_revision = "0002_fleet"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("fleet_samples") as batch:
        batch.add_column(sa.Column("timestamp_anomalies", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("evidence", JSONDoc, nullable=True))
        batch.add_column(sa.Column("top_recommendation_title", sa.String(256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("fleet_samples") as batch:
        batch.drop_column("top_recommendation_title")
        batch.drop_column("evidence")
        batch.drop_column("timestamp_anomalies")
