"""partial index of queued reservations (the pool-lease worker claims and counts them per batch)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 20:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

QUEUED = "status = 'queued'"


def upgrade() -> None:
    op.create_index(
        "ix_reservations_queued",
        "reservations",
        ["pool_id", "created_at", "id"],
        unique=False,
        postgresql_where=sa.text(QUEUED),
    )


def downgrade() -> None:
    op.drop_index("ix_reservations_queued", table_name="reservations", postgresql_where=sa.text(QUEUED))
