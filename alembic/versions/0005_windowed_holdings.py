"""windowed holdings: scalars and quota held per instant over each reservation's window; status ended

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 14:45:00.000000

The counters ``node_resources.allocated``, ``quota_usage.used`` and ``pool_capacity_rollup.allocated``
become windowed holdings with the same totals:

- every live allocation (``released_at IS NULL``) of a placed reservation holds its ``resources`` on its
  node over its window (``scalar_holdings``);
- every placed reservation holds, for its tenant's quota, the atoms per device class and the scalar
  amounts of its live allocations, over the span of their windows (``quota_holdings``);
- placed reservations get ``ends_at``, the end of their window.

Downgrade recomputes the counters from the holdings (every holding counted, as the counters did).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
STATUSES_BEFORE = "status IN ('placed', 'pending', 'queued', 'released', 'preempted')"
STATUSES_AFTER = "status IN ('placed', 'pending', 'queued', 'released', 'preempted', 'ended')"

# the live allocations of placed reservations: what the counters counted
LIVE = """
    SELECT a.* FROM allocations a JOIN reservations r ON r.id = a.reservation_id
     WHERE r.status = 'placed' AND a.released_at IS NULL
"""


def upgrade() -> None:
    op.create_table(
        "scalar_holdings",
        sa.Column("allocation_id", sa.Text(), nullable=False),
        sa.Column("resource", sa.Text(), nullable=False),
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("pool_id", sa.Text(), nullable=False),
        sa.Column("amount", sa.Numeric(), nullable=False),
        sa.Column("starts_at", TS, nullable=False),
        sa.Column("ends_at", TS, nullable=False),
        sa.CheckConstraint("amount > 0 AND starts_at < ends_at", name=op.f("ck_scalar_holdings_window")),
        sa.ForeignKeyConstraint(
            ["allocation_id"],
            ["allocations.id"],
            name=op.f("fk_scalar_holdings_allocation_id_allocations"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_scalar_holdings_node_id_nodes")),
        sa.PrimaryKeyConstraint("allocation_id", "resource", name=op.f("pk_scalar_holdings")),
    )
    op.create_index("ix_scalar_holdings_node", "scalar_holdings", ["node_id", "resource", "ends_at"])
    op.create_index("ix_scalar_holdings_pool", "scalar_holdings", ["pool_id", "ends_at"])
    op.create_table(
        "quota_holdings",
        sa.Column("reservation_id", sa.Text(), nullable=False),
        sa.Column("resource", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("pool_id", sa.Text(), nullable=False),
        sa.Column("amount", sa.Numeric(), nullable=False),
        sa.Column("starts_at", TS, nullable=False),
        sa.Column("ends_at", TS, nullable=False),
        sa.CheckConstraint("amount > 0 AND starts_at < ends_at", name=op.f("ck_quota_holdings_window")),
        sa.ForeignKeyConstraint(["pool_id"], ["pools.id"], name=op.f("fk_quota_holdings_pool_id_pools")),
        sa.ForeignKeyConstraint(
            ["reservation_id"],
            ["reservations.id"],
            name=op.f("fk_quota_holdings_reservation_id_reservations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("reservation_id", "resource", name=op.f("pk_quota_holdings")),
    )
    op.create_index(
        "ix_quota_holdings_tenant", "quota_holdings", ["tenant_id", "pool_id", "resource", "ends_at"]
    )
    op.add_column("reservations", sa.Column("ends_at", TS, nullable=True))
    op.create_index(
        "ix_reservations_placed_ends_at",
        "reservations",
        ["ends_at"],
        postgresql_where=sa.text("status = 'placed'"),
    )
    op.drop_constraint(op.f("ck_reservations_status"), "reservations", type_="check")
    op.create_check_constraint(op.f("ck_reservations_status"), "reservations", STATUSES_AFTER)

    # the counters as windowed holdings, with the same totals
    op.execute(
        f"""
        INSERT INTO scalar_holdings (allocation_id, resource, node_id, pool_id, amount, starts_at, ends_at)
        SELECT a.id, r.key, a.node_id, a.pool_id, r.value::numeric, lower(a.during), upper(a.during)
          FROM ({LIVE}) a, jsonb_each_text(a.resources) r
         WHERE r.value::numeric > 0
        """
    )
    op.execute(
        f"""
        WITH live AS ({LIVE}),
             amounts AS (
                SELECT a.reservation_id, d.class AS resource, count(*)::numeric AS amount
                  FROM live a JOIN devices d ON d.id = ANY(a.atoms)
                 GROUP BY 1, 2
                UNION ALL
                SELECT a.reservation_id, r.key, sum(r.value::numeric)
                  FROM live a, jsonb_each_text(a.resources) r
                 GROUP BY 1, 2
             ),
             spans AS (
                SELECT reservation_id, min(lower(during)) AS starts_at, max(upper(during)) AS ends_at
                  FROM live GROUP BY 1
             )
        INSERT INTO quota_holdings (reservation_id, resource, tenant_id, pool_id, amount, starts_at, ends_at)
        SELECT m.reservation_id, m.resource, res.tenant_id, res.pool_id, sum(m.amount), s.starts_at, s.ends_at
          FROM amounts m
          JOIN spans s USING (reservation_id)
          JOIN reservations res ON res.id = m.reservation_id
         GROUP BY m.reservation_id, m.resource, res.tenant_id, res.pool_id, s.starts_at, s.ends_at
        HAVING sum(m.amount) > 0
        """
    )
    op.execute(
        f"""
        UPDATE reservations r SET ends_at = s.ends_at
          FROM (SELECT reservation_id, max(upper(during)) AS ends_at FROM ({LIVE}) a GROUP BY 1) s
         WHERE s.reservation_id = r.id
        """
    )
    op.drop_constraint(op.f("ck_node_resources_amounts"), "node_resources", type_="check")
    op.drop_column("node_resources", "allocated")
    op.create_check_constraint(
        op.f("ck_node_resources_amounts"), "node_resources", "allocatable >= 0 AND ratio > 0"
    )
    op.drop_constraint(op.f("ck_quota_usage_used"), "quota_usage", type_="check")
    op.drop_column("quota_usage", "used")
    op.drop_column("pool_capacity_rollup", "allocated")


def downgrade() -> None:
    op.add_column(
        "pool_capacity_rollup",
        sa.Column("allocated", sa.Numeric(), server_default=sa.text("'0'::numeric"), nullable=False),
    )
    op.add_column(
        "quota_usage", sa.Column("used", sa.Numeric(), server_default=sa.text("'0'::numeric"), nullable=False)
    )
    op.create_check_constraint(op.f("ck_quota_usage_used"), "quota_usage", "used >= 0")
    op.drop_constraint(op.f("ck_node_resources_amounts"), "node_resources", type_="check")
    op.add_column(
        "node_resources",
        sa.Column("allocated", sa.Numeric(), server_default=sa.text("'0'::numeric"), nullable=False),
    )
    op.create_check_constraint(
        "ck_node_resources_amounts", "node_resources", "allocatable >= 0 AND ratio > 0 AND allocated >= 0"
    )
    op.execute(
        """
        UPDATE node_resources nr SET allocated = h.n
          FROM (SELECT node_id, resource, sum(amount) AS n FROM scalar_holdings
                 WHERE ends_at > now() GROUP BY 1, 2) h
         WHERE h.node_id = nr.node_id AND h.resource = nr.resource
        """
    )
    op.execute(
        """
        UPDATE quota_usage q SET used = h.n
          FROM (SELECT tenant_id, pool_id, resource, sum(amount) AS n FROM quota_holdings
                 WHERE ends_at > now() GROUP BY 1, 2, 3) h
         WHERE h.tenant_id = q.tenant_id AND h.pool_id = q.pool_id AND h.resource = q.resource
        """
    )
    op.execute(
        """
        UPDATE pool_capacity_rollup p SET allocated = h.n
          FROM (SELECT pool_id, resource, sum(n) AS n FROM (
                  SELECT pool_id, resource, amount AS n FROM scalar_holdings WHERE ends_at > now()
                  UNION ALL
                  SELECT b.pool_id, d.class, 1 FROM device_bookings b JOIN devices d ON d.pk = b.device_pk
                   WHERE upper(b.during) > now()
                ) held GROUP BY 1, 2) h
         WHERE h.pool_id = p.pool_id AND h.resource = p.resource
        """
    )
    op.execute("UPDATE reservations SET status = 'released' WHERE status = 'ended'")
    op.drop_constraint(op.f("ck_reservations_status"), "reservations", type_="check")
    op.create_check_constraint(op.f("ck_reservations_status"), "reservations", STATUSES_BEFORE)
    op.drop_index(
        "ix_reservations_placed_ends_at",
        table_name="reservations",
        postgresql_where=sa.text("status = 'placed'"),
    )
    op.drop_column("reservations", "ends_at")
    op.drop_index("ix_quota_holdings_tenant", table_name="quota_holdings")
    op.drop_table("quota_holdings")
    op.drop_index("ix_scalar_holdings_pool", table_name="scalar_holdings")
    op.drop_index("ix_scalar_holdings_node", table_name="scalar_holdings")
    op.drop_table("scalar_holdings")
