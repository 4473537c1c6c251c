"""rate limits across workers and replicas: ``rate_limit_counters`` holds each limited name's current
window, shared by every process of the deployment; UNLOGGED (docs/operating.md, "Rate limits")

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-12 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rate_limit_counters",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("window_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("taken", sa.Integer(), nullable=False),
        sa.Column("granted", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_rate_limit_counters")),
        prefixes=["UNLOGGED"],
    )


def downgrade() -> None:
    op.drop_table("rate_limit_counters")
