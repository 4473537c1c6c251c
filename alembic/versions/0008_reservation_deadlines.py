"""reservation deadlines: a nullable ``deadline`` column and a partial index of waiting reservations by it
(the lifecycle's deadline sweep; docs/lifecycle.md, "Deadlines")

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 14:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

WAITING_WITH_DEADLINE = "status IN ('pending', 'queued') AND deadline IS NOT NULL"


def upgrade() -> None:
    # nullable, no default: adding it rewrites no row; reservations made before have no deadline
    op.add_column("reservations", sa.Column("deadline", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_reservations_waiting_deadline",
        "reservations",
        ["deadline"],
        unique=False,
        postgresql_where=sa.text(WAITING_WITH_DEADLINE),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_reservations_waiting_deadline",
        table_name="reservations",
        postgresql_where=sa.text(WAITING_WITH_DEADLINE),
    )
    op.drop_column("reservations", "deadline")
