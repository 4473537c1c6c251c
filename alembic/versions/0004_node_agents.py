"""node agents: heartbeat interval, last heartbeat, agent error, device health reason

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 14:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

AGENT_NODES = sa.text("agent_interval_seconds IS NOT NULL AND NOT heartbeat_lost")


def upgrade() -> None:
    op.add_column("nodes", sa.Column("agent_interval_seconds", sa.Integer(), nullable=True))
    op.add_column("nodes", sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("nodes", sa.Column("agent_error", sa.Text(), nullable=True))
    op.add_column("devices", sa.Column("health_reason", sa.Text(), nullable=True))
    op.create_index(
        "ix_nodes_agent_heartbeat", "nodes", ["last_heartbeat_at"], unique=False, postgresql_where=AGENT_NODES
    )


def downgrade() -> None:
    op.drop_index("ix_nodes_agent_heartbeat", table_name="nodes", postgresql_where=AGENT_NODES)
    op.drop_column("devices", "health_reason")
    op.drop_column("nodes", "agent_error")
    op.drop_column("nodes", "last_heartbeat_at")
    op.drop_column("nodes", "agent_interval_seconds")
