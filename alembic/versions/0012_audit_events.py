"""audit log: ``audit_events`` holds one row per mutating /v1/ request: who, what, when and the
answer's status (docs/operating.md, "Audit log")

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-10 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("request_id", sa.Text(), nullable=True),
        sa.Column("key_id", sa.Text(), nullable=True),
        sa.Column("principal", sa.Text(), nullable=True),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=True),
        sa.Column("operation_id", sa.Text(), nullable=False),
        sa.Column("method", sa.Text(), nullable=False),
        sa.Column("route", sa.Text(), nullable=False),
        sa.Column("path_params", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_id", sa.Text(), nullable=True),
        sa.Column("resources", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("status", sa.SmallInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_events")),
    )
    op.create_index("ix_audit_events_at", "audit_events", ["at", "id"])
    op.create_index("ix_audit_events_key_id", "audit_events", ["key_id", "at"])
    op.create_index("ix_audit_events_resources", "audit_events", ["resources"], postgresql_using="gin")


def downgrade() -> None:
    op.drop_index("ix_audit_events_resources", table_name="audit_events")
    op.drop_index("ix_audit_events_key_id", table_name="audit_events")
    op.drop_index("ix_audit_events_at", table_name="audit_events")
    op.drop_table("audit_events")
