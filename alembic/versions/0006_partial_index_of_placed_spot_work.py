"""partial index of placed spot reservations (spot preemption reads them per pending regular create)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 17:35:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

PLACED_SPOT = "status = 'placed' AND ((spec ->> 'spot'))::boolean"


def upgrade() -> None:
    op.create_index(
        "ix_reservations_placed_spot",
        "reservations",
        ["pool_id"],
        unique=False,
        postgresql_where=sa.text(PLACED_SPOT),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_reservations_placed_spot", table_name="reservations", postgresql_where=sa.text(PLACED_SPOT)
    )
