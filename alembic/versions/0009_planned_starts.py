"""planned starts (backfill that protects the head of the queue): ``allocations.planned`` marks the
allocation of a pending reservation's planned window, ``reservations.planned_start`` its start, and a
partial index of pending reservations by planned start (the lifecycle's sweep that places them then;
docs/lifecycle.md, "Planned starts")

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 14:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

PENDING_WITH_PLAN = "status = 'pending' AND planned_start IS NOT NULL"


def upgrade() -> None:
    # a constant default: PostgreSQL adds the column without rewriting a row; every allocation made
    # before was a placement, not a plan
    op.add_column(
        "allocations",
        sa.Column("planned", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.add_column("reservations", sa.Column("planned_start", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_reservations_planned_start",
        "reservations",
        ["planned_start"],
        unique=False,
        postgresql_where=sa.text(PENDING_WITH_PLAN),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_reservations_planned_start",
        table_name="reservations",
        postgresql_where=sa.text(PENDING_WITH_PLAN),
    )
    op.drop_column("reservations", "planned_start")
    op.drop_column("allocations", "planned")
