"""device ids of deleted nodes: ``devices.deleted_at`` (set with its node's) and a device id unique among
the live devices only, so a host whose node was deleted registers again with the same ids while the
deleted node's devices stay as the history of their bookings (docs/operating.md, "Maintenance: drain and
delete")

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-12 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("devices", sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(
        "UPDATE devices d SET deleted_at = n.deleted_at FROM nodes n"
        " WHERE n.id = d.node_id AND n.deleted_at IS NOT NULL"
    )
    op.drop_constraint("uq_devices_id", "devices", type_="unique")
    op.create_index(
        "uq_devices_id", "devices", ["id"], unique=True, postgresql_where=sa.text("deleted_at IS NULL")
    )


def downgrade() -> None:
    op.drop_index("uq_devices_id", table_name="devices")
    # a deleted node's device whose id a live device (or another deleted one) took again gives it up, as
    # 0013's downgrade does for names; its bookings and allocations keep the id they were made with
    op.execute(
        "UPDATE devices d SET id = d.id || '~' || d.node_id WHERE d.deleted_at IS NOT NULL"
        " AND EXISTS (SELECT 1 FROM devices o WHERE o.id = d.id AND o.pk <> d.pk)"
    )
    op.create_unique_constraint("uq_devices_id", "devices", ["id"])
    op.drop_column("devices", "deleted_at")
