"""API keys that expire and say when they were last used: nullable ``expires_at`` and ``last_used_at`` on
``api_keys`` (docs/operating.md, "Keys")

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # nullable, no default: adding them rewrites no row; keys made before never expire
    op.add_column("api_keys", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("api_keys", sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("api_keys", "last_used_at")
    op.drop_column("api_keys", "expires_at")
