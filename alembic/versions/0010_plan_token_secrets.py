"""plan tokens: ``plan_token_secrets`` holds the one random key plan tokens are signed with when
``BC_PLAN_TOKEN_SECRET`` is unset, shared by every replica (docs/api.md, "Plan tokens")

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "plan_token_secrets",
        sa.Column("id", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("secret", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_plan_token_secrets_one_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_plan_token_secrets")),
    )


def downgrade() -> None:
    op.drop_table("plan_token_secrets")
