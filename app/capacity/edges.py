"""Wake edges (docs/lifecycle.md): the changes that may let a pending reservation fit,
sent with PostgreSQL ``NOTIFY`` on one channel inside the transaction that caused them, so an edge is
heard exactly when (and only if) its cause commits.

Payload: ``{"pool": <pool id>, "tenant": <tenant id> | null}``. ``tenant`` is null for an edge that may
help any tenant of the pool (a release, an end, freed atoms, a node that is schedulable for everyone)
and names one tenant for an edge that helps only that tenant (its quota raised, a node that is
schedulable only for the tenant it is dedicated to). Every replica LISTENs on the channel
(:mod:`app.capacity.controllers.wake`); PostgreSQL folds identical notifications of one transaction into one.

Which edges can clear which rejection (docs/architecture.md), as the callers send them:

=====================================  ==============================================================
edge (sent by)                         rejections it may clear
=====================================  ==============================================================
release, end, repair freed atoms       ``fits: ...``, ``scalars: ...``, ``topology: ...`` in the pool
node added (add_node, import, Hello)   every rejection: a new node is a new candidate
uncordon, taints replaced, health      the NoSchedule reasons (``schedulable``) and ``fits`` (atoms back)
labels replaced                        ``labels: ...`` and selectors reading node labels
quota raised (one tenant)              a wake that stopped on ``QuotaExceeded``
=====================================  ==============================================================

A node edge is sent only when the node is now schedulable for someone (``mayBeSchedulableSql``): a
cordon or a new taint on an unschedulable node wakes nobody, and a node left with one dedication wakes
only the dedicated tenant.

Repair edges go on their own channel (``bc_repair``, payload: the pool id): an atom that turned
unhealthy or unbookable (the health route, an agent's heartbeat or Hello) fits no pending work, it asks
for BookingRepair, which every replica runs on its own task ahead of any wake
(:mod:`app.capacity.controllers.repair_first`, docs/lifecycle.md "Repair first").
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.predicates import may_be_schedulable_sql
from app.db.tables import nodes, pools
from app.placement.schedulable import DEDICATION_PREFIX

WAKE_CHANNEL = "bc_wake"
REPAIR_CHANNEL = "bc_repair"


def wake_payload(pool_id: str, tenant_id: str | None = None) -> str:
    """The NOTIFY payload of an edge in ``pool_id`` (for ``tenant_id`` only, or for every tenant)."""
    return json.dumps({"pool": pool_id, "tenant": tenant_id}, separators=(",", ":"))


def parse_wake_payload(payload: str) -> tuple[str, str | None] | None:
    """``(pool id, tenant id | None)`` of a payload, or None when it is not one of ours."""
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("pool"), str):
        return None
    tenant = data.get("tenant")
    return data["pool"], tenant if isinstance(tenant, str) else None


async def notify_pool(conn: AsyncConnection, pool_id: str, tenant_id: str | None = None) -> None:
    """Send the edge "``pool_id`` may fit more" (for ``tenant_id`` only when given); delivered when
    ``conn``'s transaction commits."""
    # SELECT pg_notify('bc_wake', :payload)
    await conn.execute(sa.select(sa.func.pg_notify(WAKE_CHANNEL, wake_payload(pool_id, tenant_id))))


async def notify_node(conn: AsyncConnection, node_id: str) -> None:
    """Send the edge of a node that changed (added, uncordoned, taints, health, labels) when it is now
    schedulable for some tenant: for every tenant when it has no NoSchedule reason, else only for the
    tenant it is dedicated to. Nothing is sent for a node that is still unschedulable."""
    reasons = sa.func.coalesce(nodes.c.no_schedule_reasons, sa.text("'{}'::text[]"))
    tenant = sa.case(
        (sa.func.cardinality(reasons) == 0, sa.null()),
        else_=sa.func.substr(nodes.c.no_schedule_reasons[1], len(DEDICATION_PREFIX) + 1),
    )
    payload = sa.cast(sa.func.json_build_object("pool", nodes.c.pool_id, "tenant", tenant), sa.Text)
    # SELECT pg_notify('bc_wake', json_build_object('pool', n.pool_id, 'tenant',
    #          CASE WHEN cardinality(n.no_schedule_reasons) = 0 THEN NULL
    #               ELSE substr(n.no_schedule_reasons[1], 19) END)::text)
    #   FROM nodes n JOIN pools p ON p.id = n.pool_id
    #  WHERE n.id = :node AND <mayBeSchedulableSql>
    await conn.execute(
        sa.select(sa.func.pg_notify(WAKE_CHANNEL, payload))
        .select_from(nodes.join(pools, pools.c.id == nodes.c.pool_id))
        .where(nodes.c.id == node_id, may_be_schedulable_sql())
    )


async def notify_repair(conn: AsyncConnection, pool_id: str) -> None:
    """Send the edge "atoms of ``pool_id`` turned unhealthy or unbookable": BookingRepair runs on it
    (ahead of any wake, docs/lifecycle.md "Repair first"); delivered when ``conn``'s transaction commits."""
    # SELECT pg_notify('bc_repair', :pool)
    await conn.execute(sa.select(sa.func.pg_notify(REPAIR_CHANNEL, pool_id)))
