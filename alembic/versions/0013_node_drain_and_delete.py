"""node drain and delete: ``nodes.draining`` (the NoSchedule reason ``draining``) and ``nodes.deleted_at``
(a deleted node stays as the history of its allocations); a node's name is unique among the live nodes
of its pool only, so a new node may take a deleted one's name (docs/operating.md, "Maintenance: drain and
delete")

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-10 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
# on merge, point this at the newest revision before it (0011/0012 of work done in parallel)
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("draining", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.add_column("nodes", sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))
    op.drop_constraint("uq_nodes_pool_id_name", "nodes", type_="unique")
    op.create_index(
        "uq_nodes_pool_id_name",
        "nodes",
        ["pool_id", "name"],
        unique=True,
        postgresql_where=sa.text("deleted_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("uq_nodes_pool_id_name", table_name="nodes")
    # a deleted node's name may be taken by a live one again: the deleted rows give theirs up
    op.execute("UPDATE nodes SET name = name || '~' || id WHERE deleted_at IS NOT NULL")
    op.create_unique_constraint("uq_nodes_pool_id_name", "nodes", ["pool_id", "name"])
    op.drop_column("nodes", "deleted_at")
    op.drop_column("nodes", "draining")
