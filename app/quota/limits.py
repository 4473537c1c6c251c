"""Quota limit writes: replace a tenant's limits in a pool, checked against the pool's resources first
(docs/quota.md, "Writing limits").

A PUT replaces, it does not merge: the tenant's limits become exactly the body's, and the answer warns of
each limit the write dropped. Writes of one tenant and pool are serialized by a transaction-scoped
advisory lock (:data:`QUOTA_WRITE_LOCK`) that nothing else takes, and a write takes no pool, node or
device lock, so it never waits in a cycle with a charge (app/quota/charges.py). Lowering a limit below
what is held is allowed: new charges over it fail until usage falls under it.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.answers.quota import QuotaWritten
from app.capacity.edges import notify_pool
from app.db.tables import devices, node_resources, nodes, quota_limits
from app.db.tx import transaction
from app.errors import InvalidInput
from app.jsonnum import num
from app.quota.charges import ensure_usage_rows
from app.quota.view import quota_view, require_pool

QUOTA_WRITE_LOCK = 150_011  # the advisory lock class of quota writes (the key: hashtext(tenant / pool))


def _quota_write_lock(tenant_id: str, pool_id: str) -> Any:
    # SELECT pg_advisory_xact_lock(QUOTA_WRITE_LOCK, hashtext(:tenant_id || '/' || :pool_id))
    return sa.select(
        sa.func.pg_advisory_xact_lock(
            sa.literal_column(str(QUOTA_WRITE_LOCK)),
            sa.func.hashtext(sa.literal(tenant_id, sa.Text) + "/" + sa.literal(pool_id, sa.Text)),
        )
    )


async def set_limits(
    conn: AsyncConnection, tenant_id: str, pool_id: str, limits: Mapping[str, Decimal]
) -> dict[str, Decimal]:
    """Replace the tenant's limits in the pool with ``limits`` (resource -> amount >= 0); returns the
    limits the tenant had before (resource -> amount), read under the write's lock.

    Writes of one tenant and pool are serialized by a transaction-scoped advisory lock taken first
    (:data:`QUOTA_WRITE_LOCK`): without it two writers' ``DELETE`` both see the old rows and their
    ``INSERT`` s collide on the primary key (a 500). Under the lock the last writer wins whole, and what a
    writer reads back in its transaction is exactly the row set it wrote. The lock is held by nothing
    else, and a quota write takes no pool, node or device lock, so it never waits in a cycle with a
    charge (docs/quota.md, "Writing limits").

    Lowering a limit below current usage is allowed: new charges fail until usage falls under it.
    """
    await conn.execute(_quota_write_lock(tenant_id, pool_id))
    before = {
        r.resource: r.limit
        for r in await conn.execute(
            sa.select(quota_limits.c.resource, quota_limits.c.limit).where(
                quota_limits.c.tenant_id == tenant_id, quota_limits.c.pool_id == pool_id
            )
        )
    }
    await ensure_usage_rows(conn, tenant_id, pool_id, sorted(limits))
    await conn.execute(
        sa.delete(quota_limits).where(
            quota_limits.c.tenant_id == tenant_id, quota_limits.c.pool_id == pool_id
        )
    )
    if limits:
        await conn.execute(
            sa.insert(quota_limits),
            [
                {"tenant_id": tenant_id, "pool_id": pool_id, "resource": r, "limit": amount}
                for r, amount in sorted(limits.items())
            ],
        )
    return before


# SELECT DISTINCT d.class FROM devices d JOIN nodes n ON n.id = d.node_id WHERE n.pool_id = :pool_id
_POOL_CLASSES = (
    sa.select(devices.c["class"])
    .distinct()
    .select_from(devices.join(nodes, nodes.c.id == devices.c.node_id))
    .where(nodes.c.pool_id == sa.bindparam("pool_id", type_=sa.Text), nodes.c.deleted_at.is_(None))
)
# SELECT DISTINCT r.resource FROM node_resources r JOIN nodes n ON n.id = r.node_id WHERE n.pool_id = :pool_id
_POOL_SCALARS = (
    sa.select(node_resources.c.resource)
    .distinct()
    .select_from(node_resources.join(nodes, nodes.c.id == node_resources.c.node_id))
    .where(nodes.c.pool_id == sa.bindparam("pool_id", type_=sa.Text), nodes.c.deleted_at.is_(None))
)


async def pool_resources(conn: AsyncConnection, pool_id: str) -> tuple[frozenset[str], frozenset[str], bool]:
    """``(device classes, scalar resources, has nodes)`` of the pool: the names some node of it has."""
    has_nodes = (
        await conn.execute(
            sa.select(sa.exists().where(nodes.c.pool_id == pool_id, nodes.c.deleted_at.is_(None)))
        )
    ).scalar_one()
    classes = frozenset((await conn.execute(_POOL_CLASSES, {"pool_id": pool_id})).scalars())
    scalars = frozenset((await conn.execute(_POOL_SCALARS, {"pool_id": pool_id})).scalars())
    return classes, scalars, bool(has_nodes)


def check_limits(
    limits: Mapping[str, Decimal], classes: frozenset[str], scalars: frozenset[str], has_nodes: bool
) -> list[str]:
    """Check a quota write against what the pool has (docs/quota.md, "Writing limits"); returns the
    warnings of an empty pool.

    In a pool with nodes, a name that is neither a device class nor a scalar resource of any node raises
    :class:`~app.errors.InvalidInput` at ``limits.<name>`` naming the pool's resources; a device class
    counts whole atoms, so a fractional device-class limit raises at ``limits.<class>``. In a pool
    without nodes nothing is known: every name is accepted, with one warning per name. Names are checked
    in sorted order (the first bad one is named)."""
    if not has_nodes:
        return [
            f"limits.{name}: pool has no nodes yet, so {name} is not checked against its resources"
            for name in sorted(limits)
        ]
    known = sorted(classes | scalars)
    for name in sorted(limits):
        if name not in classes and name not in scalars:
            raise InvalidInput(
                f"limits.{name}: no node of the pool has {name}; it has {', '.join(known) or 'none'}",
                path=f"limits.{name}",
                details={"resources": known},
            )
        amount = limits[name]
        if name in classes and name not in scalars and amount != amount.to_integral_value():
            raise InvalidInput(
                f"limits.{name}: {name} is a device class, counted in whole devices; got {num(amount)}",
                path=f"limits.{name}",
            )
    return []


@transaction
async def replace_limits(
    conn: AsyncConnection, tenant_id: str, pool_id: str, limits: Mapping[str, Decimal]
) -> QuotaWritten:
    """Replace the tenant's limits in an existing pool (PUT replaces, it does not merge: docs/quota.md,
    "Writing limits") and answer the quota as written (:func:`~app.quota.view.quota_view`) with
    ``warnings``: the limits this write dropped, and, in a pool without nodes, the names not checked.
    Raises :class:`~app.errors.NotFound` for an unknown pool and :class:`~app.errors.InvalidInput`
    (:func:`check_limits`) before anything is written."""
    await require_pool(conn, pool_id)
    warnings = check_limits(limits, *await pool_resources(conn, pool_id))
    before = await set_limits(conn, tenant_id, pool_id, limits)
    warnings += [
        f"limits.{name}: the limit of {num(before[name])} was removed: {name} is now unlimited"
        for name in sorted(set(before) - set(limits))
    ]
    await notify_pool(conn, pool_id, tenant_id)  # wake edge: the tenant's quota may have been raised
    written = await quota_view(conn, tenant_id, pool_id)
    return QuotaWritten(**written.model_dump(), warnings=warnings)
