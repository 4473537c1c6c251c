"""The capacity model as SQLAlchemy Core tables (docs/architecture.md).

Alembic migrations under ``alembic/versions`` create exactly these tables; ``alembic check`` compares
them. Numeric amounts are ``numeric`` (``Decimal`` in Python) so ``floor(100 * 0.29)`` is 29 everywhere.
Booking windows are half-open ``tstzrange`` values ``[start, end)``; scalar and quota holdings are
half-open ``[starts_at, ends_at)`` windows too, counted per instant (docs/lifecycle.md).

Lock order in every multi-table transaction (docs/placement-rules.md, "Commit and lock order", with issue
15's late
quota charge): reservations (own row) -> pools -> nodes -> devices -> node_resources -> quota_usage, and
pool_capacity_rollup (inventory only) after node_resources. Cuts, refunds and drops of holdings only
shrink what is held and take none of these row locks.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

NOW = sa.text("now()")
TS = sa.DateTime(timezone=True)

pools = sa.Table(
    "pools",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("name", sa.Text, nullable=False, unique=True),
    # bumped in the same transaction as every inventory change; the pool cache keys on it
    sa.Column("inventory_version", sa.BigInteger, nullable=False, server_default="1"),
    sa.Column("created_at", TS, nullable=False, server_default=NOW),
    sa.Column("archived_at", TS),
)

nodes = sa.Table(
    "nodes",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("pool_id", sa.Text, sa.ForeignKey("pools.id"), nullable=False, index=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("cordoned", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("ready", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Column("heartbeat_lost", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("leasable", sa.Boolean, nullable=False, server_default=sa.true()),
    # drained for maintenance (docs/operating.md, "Maintenance: drain and delete"): the reason `draining`
    sa.Column("draining", sa.Boolean, nullable=False, server_default=sa.false()),
    # kept in the same transaction as their cause (cordon, drain, conditions, NoSchedule taints)
    sa.Column(
        "no_schedule_reasons", pg.ARRAY(sa.Text), nullable=False, server_default=sa.text("'{}'::text[]")
    ),
    sa.Column("created_at", TS, nullable=False, server_default=NOW),
    # set by the node's agent (Hello): its heartbeat interval, the last Hello or heartbeat, and the failure
    # its last Hello/heartbeat reported (nvidia-smi failed); NULL interval = a node without an agent
    sa.Column("agent_interval_seconds", sa.Integer),
    sa.Column("last_heartbeat_at", TS),
    sa.Column("agent_error", sa.Text),
    # a deleted node stays as the history of its allocations, hidden from every pool read; its name is
    # free again for a new node of the pool (the unique index below covers live nodes only)
    sa.Column("deleted_at", TS),
    sa.Index(
        "uq_nodes_pool_id_name",
        "pool_id",
        "name",
        unique=True,
        postgresql_where=sa.text("deleted_at IS NULL"),
    ),
    # the shortlist reads only the nodes with a NoSchedule reason
    sa.Index(
        "ix_nodes_with_reasons",
        "pool_id",
        postgresql_where=sa.text("no_schedule_reasons <> '{}'::text[]"),
    ),
    # the liveness sweep reads only agents' nodes whose heartbeat is not yet lost, oldest heartbeat first
    sa.Index(
        "ix_nodes_agent_heartbeat",
        "last_heartbeat_at",
        postgresql_where=sa.text("agent_interval_seconds IS NOT NULL AND NOT heartbeat_lost"),
    ),
)

node_labels = sa.Table(
    "node_labels",
    metadata,
    sa.Column("node_id", sa.Text, sa.ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("source", sa.Text, nullable=False, server_default="operator"),
    sa.CheckConstraint("source IN ('system', 'operator')", name="source"),
)

node_taints = sa.Table(
    "node_taints",
    metadata,
    sa.Column("node_id", sa.Text, sa.ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("effect", sa.Text, primary_key=True),
    sa.Column("value", sa.Text, nullable=False, server_default=""),
    sa.CheckConstraint("effect IN ('NoSchedule', 'PreferNoSchedule', 'NoExecute')", name="effect"),
)

devices = sa.Table(
    "devices",
    metadata,
    # a bigint surrogate key: the booking exclusion constraint ranges over it (no btree_gist needed)
    sa.Column("pk", sa.BigInteger, sa.Identity(always=False), primary_key=True),
    # the agent's id (a GPU UUID): unique among the live devices only (the index below), so a host whose
    # node was deleted registers again with the same ids; bookings name a device by ``pk``
    sa.Column("id", sa.Text, nullable=False),
    sa.Column("node_id", sa.Text, sa.ForeignKey("nodes.id"), nullable=False, index=True),
    sa.Column("class", sa.Text, nullable=False),
    sa.Column("attributes", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column("numa_node", sa.Integer),
    sa.Column("parent_id", sa.Text),
    sa.Column("healthy", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Column("bookable", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Column("ordinal", sa.Integer, nullable=False, server_default="0"),
    # why the agent last reported the atom unhealthy (``device disappeared``, ``row remapping failure``)
    sa.Column("health_reason", sa.Text),
    # set with its node's ``deleted_at`` (docs/operating.md, "Maintenance: drain and delete"): the row
    # stays as the history of its bookings and gives its id up to a live device
    sa.Column("deleted_at", TS),
    sa.Index("uq_devices_id", "id", unique=True, postgresql_where=sa.text("deleted_at IS NULL")),
    # the volatile read of a request touches only unhealthy/unbookable atoms, not every device row
    sa.Index(
        "ix_devices_unavailable",
        "node_id",
        postgresql_where=sa.text("NOT (healthy AND bookable)"),
    ),
)

capacity_device_links = sa.Table(
    "capacity_device_links",
    metadata,
    sa.Column("node_id", sa.Text, sa.ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("a", sa.Text, primary_key=True),
    sa.Column("b", sa.Text, primary_key=True),
    sa.Column("link", sa.Text, nullable=False),
    sa.CheckConstraint("a < b", name="ordered"),
)

node_resources = sa.Table(
    "node_resources",
    metadata,
    sa.Column("node_id", sa.Text, sa.ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("resource", sa.Text, primary_key=True),
    sa.Column("allocatable", sa.Numeric, nullable=False),
    sa.Column("ratio", sa.Numeric, nullable=False, server_default="1"),
    sa.CheckConstraint("allocatable >= 0 AND ratio > 0", name="amounts"),
)

# What allocations hold of a node's scalar resources, over their windows: the amount held at an instant
# is the sum of the rows whose window contains it. The guarded commit inserts a row under the
# node_resources row lock only when the peak over the window leaves room (app/capacity/commit/single.py). A
# release cuts ``ends_at`` at the release instant (or deletes a row that had not started); rows stay as
# history otherwise, and reads skip the past by ``ends_at``.
scalar_holdings = sa.Table(
    "scalar_holdings",
    metadata,
    sa.Column(
        "allocation_id", sa.Text, sa.ForeignKey("allocations.id", ondelete="CASCADE"), primary_key=True
    ),
    sa.Column("resource", sa.Text, primary_key=True),
    sa.Column("node_id", sa.Text, sa.ForeignKey("nodes.id"), nullable=False),
    sa.Column("pool_id", sa.Text, nullable=False),
    sa.Column("amount", sa.Numeric, nullable=False),
    sa.Column("starts_at", TS, nullable=False),
    sa.Column("ends_at", TS, nullable=False),
    sa.CheckConstraint("amount > 0 AND starts_at < ends_at", name="window"),
    sa.Index("ix_scalar_holdings_node", "node_id", "resource", "ends_at"),
    sa.Index("ix_scalar_holdings_pool", "pool_id", "ends_at"),
)

reservations = sa.Table(
    "reservations",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("tenant_id", sa.Text, nullable=False),
    sa.Column("pool_id", sa.Text, sa.ForeignKey("pools.id"), nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("spec", pg.JSONB, nullable=False),
    sa.Column("spec_hash", sa.Text, nullable=False),
    sa.Column("idempotency_key", sa.Text, nullable=False),
    sa.Column("conditions", pg.JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
    sa.Column("created_at", TS, nullable=False, server_default=NOW),
    sa.Column("updated_at", TS, nullable=False, server_default=NOW),
    sa.Column("released_at", TS),
    # the end of the placed window: the lifecycle controller ends the reservation after it
    sa.Column("ends_at", TS),
    # the latest start (the body's deadline, also in spec): still waiting then, it is ended
    sa.Column("deadline", TS),
    # a pending reservation's planned start: its planned allocation (allocations.planned) starts there,
    # and the lifecycle places it then (docs/lifecycle.md, "Planned starts")
    sa.Column("planned_start", TS),
    sa.UniqueConstraint("tenant_id", "idempotency_key"),
    sa.CheckConstraint(
        "status IN ('placed', 'pending', 'queued', 'released', 'preempted', 'ended')", name="status"
    ),
    sa.Index("ix_reservations_tenant_status", "tenant_id", "status"),
    # the lifecycle controller's sweep reads only placed reservations, by their end
    sa.Index("ix_reservations_placed_ends_at", "ends_at", postgresql_where=sa.text("status = 'placed'")),
    # spot preemption reads the placed spot work of a pool (app/capacity/placing/preemption.py)
    sa.Index(
        "ix_reservations_placed_spot",
        "pool_id",
        postgresql_where=sa.text("status = 'placed' AND ((spec ->> 'spot'))::boolean"),
    ),
    # the pool-lease worker claims a pool's queued reservations oldest first (app/capacity/queue/worker.py)
    sa.Index(
        "ix_reservations_queued",
        "pool_id",
        "created_at",
        "id",
        postgresql_where=sa.text("status = 'queued'"),
    ),
    # the lifecycle's deadline sweep reads waiting reservations by their deadline
    # (app/capacity/controllers/lifecycle.py, end_passed_deadlines)
    sa.Index(
        "ix_reservations_waiting_deadline",
        "deadline",
        postgresql_where=sa.text("status IN ('pending', 'queued') AND deadline IS NOT NULL"),
    ),
    # the lifecycle's sweep of planned starts reads pending reservations by their planned start
    # (app/capacity/controllers/backfill.py, start_planned)
    sa.Index(
        "ix_reservations_planned_start",
        "planned_start",
        postgresql_where=sa.text("status = 'pending' AND planned_start IS NOT NULL"),
    ),
)

allocations = sa.Table(
    "allocations",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("reservation_id", sa.Text, sa.ForeignKey("reservations.id"), nullable=False, index=True),
    sa.Column("pool_id", sa.Text, sa.ForeignKey("pools.id"), nullable=False),
    sa.Column("node_id", sa.Text, sa.ForeignKey("nodes.id"), nullable=False, index=True),
    sa.Column("atoms", pg.ARRAY(sa.Text), nullable=False, server_default=sa.text("'{}'::text[]")),
    sa.Column("resources", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column("during", pg.TSTZRANGE, nullable=False),
    sa.Column("created_at", TS, nullable=False, server_default=NOW),
    sa.Column("released_at", TS),
    # the planned window of a pending reservation (docs/lifecycle.md, "Planned starts"): booked like a
    # placement, so every guard keeps it, but not shown among the reservation's allocations
    sa.Column("planned", sa.Boolean, nullable=False, server_default=sa.text("false")),
)

device_bookings = sa.Table(
    "device_bookings",
    metadata,
    sa.Column("device_pk", sa.BigInteger, sa.ForeignKey("devices.pk"), nullable=False),
    sa.Column("device_id", sa.Text, nullable=False),
    sa.Column("pool_id", sa.Text, nullable=False),
    sa.Column("allocation_id", sa.Text, sa.ForeignKey("allocations.id", ondelete="CASCADE"), nullable=False),
    sa.Column("during", pg.TSTZRANGE, nullable=False),
    sa.PrimaryKeyConstraint("device_pk", "allocation_id"),
    # no two bookings of one device overlap: int8range over the bigint key instead of btree_gist
    pg.ExcludeConstraint(
        (sa.text("int8range(device_pk, device_pk, '[]')"), "&&"),
        ("during", "&&"),
        name="ex_device_bookings_overlap",
        using="gist",
    ),
    sa.Index("ix_device_bookings_pool_id", "pool_id"),
    sa.Index("ix_device_bookings_allocation_id", "allocation_id"),
)

# A pool's capacity per resource (atoms per class, floor(allocatable x ratio) per scalar), kept by the
# inventory in the same transaction as node changes. What is held is counted per instant from the
# bookings and holdings (the pool view shows "held now"), so no commit writes this table.
pool_capacity_rollup = sa.Table(
    "pool_capacity_rollup",
    metadata,
    sa.Column("pool_id", sa.Text, sa.ForeignKey("pools.id"), primary_key=True),
    sa.Column("resource", sa.Text, primary_key=True),
    sa.Column("total", sa.Numeric, nullable=False, server_default="0"),
)

quota_limits = sa.Table(
    "quota_limits",
    metadata,
    sa.Column("tenant_id", sa.Text, primary_key=True),
    sa.Column("pool_id", sa.Text, sa.ForeignKey("pools.id"), primary_key=True),
    sa.Column("resource", sa.Text, primary_key=True),
    sa.Column("limit", sa.Numeric, nullable=False),
    sa.CheckConstraint('"limit" >= 0', name="limit"),
)

# One row per tenant, pool and resource: the row the quota guard locks (last in the lock order) before
# it checks the peak of the tenant's holdings over a window. Usage itself is quota_holdings.
quota_usage = sa.Table(
    "quota_usage",
    metadata,
    sa.Column("tenant_id", sa.Text, primary_key=True),
    sa.Column("pool_id", sa.Text, sa.ForeignKey("pools.id"), primary_key=True),
    sa.Column("resource", sa.Text, primary_key=True),
)

# What a reservation charges to its tenant's quota, over its window (atoms per device class and scalar
# amounts, times gang members). Usage at an instant is the sum of the rows whose window contains it; a
# release cuts ``ends_at`` like scalar_holdings.
quota_holdings = sa.Table(
    "quota_holdings",
    metadata,
    sa.Column(
        "reservation_id", sa.Text, sa.ForeignKey("reservations.id", ondelete="CASCADE"), primary_key=True
    ),
    sa.Column("resource", sa.Text, primary_key=True),
    sa.Column("tenant_id", sa.Text, nullable=False),
    sa.Column("pool_id", sa.Text, sa.ForeignKey("pools.id"), nullable=False),
    sa.Column("amount", sa.Numeric, nullable=False),
    sa.Column("starts_at", TS, nullable=False),
    sa.Column("ends_at", TS, nullable=False),
    sa.CheckConstraint("amount > 0 AND starts_at < ends_at", name="window"),
    sa.Index("ix_quota_holdings_tenant", "tenant_id", "pool_id", "resource", "ends_at"),
)

principals = sa.Table(
    "principals",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("tenant_id", sa.Text),
    sa.Column("created_at", TS, nullable=False, server_default=NOW),
)

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("principal_id", sa.Text, sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("key_hash", sa.Text, nullable=False, unique=True),
    sa.Column("created_at", TS, nullable=False, server_default=NOW),
    sa.Column("revoked_at", TS),
    sa.Column("expires_at", TS),  # refused from then on (401 key expired); null: never
    sa.Column("last_used_at", TS),  # written at most once a minute per key (app/iam/service.py)
)

grants = sa.Table(
    "grants",
    metadata,
    sa.Column("principal_id", sa.Text, sa.ForeignKey("principals.id"), primary_key=True),
    sa.Column("action", sa.Text, primary_key=True),
    sa.Column("resource", sa.Text, primary_key=True),
)

# docs/explain.md queue history: job records with scheduler submit/start times, per target
fleet_job_records = sa.Table(
    "fleet_job_records",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("target", sa.Text, nullable=False),
    sa.Column("record", pg.JSONB, nullable=False),
    sa.Column("recorded_at", TS, nullable=False, server_default=NOW),
    sa.Index("ix_fleet_job_records_target", "target", "recorded_at"),
)

# the key plan tokens are signed with when BC_PLAN_TOKEN_SECRET is unset (docs/api.md, "Plan tokens"):
# one row, made by the first preview that signs one, so every replica signs and checks with the same key
plan_token_secrets = sa.Table(
    "plan_token_secrets",
    metadata,
    sa.Column("id", sa.SmallInteger, primary_key=True, autoincrement=False),
    sa.Column("secret", sa.Text, nullable=False),
    sa.Column("created_at", TS, nullable=False, server_default=NOW),
    sa.CheckConstraint("id = 1", name="one_row"),
)

# the audit log (docs/operating.md, "Audit log"): one row per mutating /v1/ request, written in the
# change's transaction when there is one (app/db/audit.py), else right after the answer; pruned after
# BC_AUDIT_RETENTION
audit_events = sa.Table(
    "audit_events",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),  # aud_<ulid>
    sa.Column("at", TS, nullable=False, server_default=NOW),  # the database clock
    sa.Column("request_id", sa.Text),
    sa.Column("key_id", sa.Text),  # None: no key authenticated (401)
    sa.Column("principal", sa.Text),
    sa.Column("role", sa.Text, nullable=False),  # admin | tenant | agent | key | anonymous
    sa.Column("tenant_id", sa.Text),  # the key's tenant
    sa.Column("operation_id", sa.Text, nullable=False),
    sa.Column("method", sa.Text, nullable=False),
    sa.Column("route", sa.Text, nullable=False),
    sa.Column("path_params", pg.JSONB, nullable=False),
    sa.Column("created_id", sa.Text),
    sa.Column("resources", pg.ARRAY(sa.Text), nullable=False),  # path parameter values, then created_id
    sa.Column("status", sa.SmallInteger, nullable=False),
    sa.Index("ix_audit_events_at", "at", "id"),
    sa.Index("ix_audit_events_key_id", "key_id", "at"),
    sa.Index("ix_audit_events_resources", "resources", postgresql_using="gin"),
)

# the deployment's rate-limit windows (docs/operating.md, "Rate limits"): one row per limited name (an API
# key, or a client address's failed authentications), the hits that processes have taken of its current
# window. UNLOGGED: no WAL, so a counter's commit never waits for a disk flush; a crash or a failover
# empties it, and every name then starts a fresh window (a lost count, never a lost reservation)
rate_limit_counters = sa.Table(
    "rate_limit_counters",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),  # key:<key id> | auth:<client address>
    sa.Column("window_end", TS, nullable=False),  # the database clock
    sa.Column("taken", sa.Integer, nullable=False),  # hits handed out in this window, at most the limit
    sa.Column("granted", sa.Integer, nullable=False),  # what the last statement handed out (0: refused)
    prefixes=["UNLOGGED"],
)
