"""Quota: limits per tenant, pool and resource (a device class such as ``gpu``, or a scalar such as
``cpu``), charged with a guarded UPDATE before placement and refunded before a release.

A resource without a limit row is not limited (its usage is still counted), as a Kubernetes namespace
without a ResourceQuota is not. ``quota_usage`` rows are locked first in every capacity transaction
(seed 000, "Commit and lock order"), always in sorted resource order so two charges never deadlock.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.tables import pools, quota_limits, quota_usage
from app.errors import NotFound, QuotaExceeded, quote_input
from app.jsonnum import num
from app.observability.metrics import QUOTA_REJECTIONS


async def set_limits(
    conn: AsyncConnection, tenant_id: str, pool_id: str, limits: Mapping[str, Decimal]
) -> None:
    """Replace the tenant's limits in the pool with ``limits`` (resource -> amount >= 0).

    Lowering a limit below current usage is allowed: new charges fail until usage falls under it.
    """
    await _ensure_usage_rows(conn, tenant_id, pool_id, sorted(limits))
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


async def get_quota(
    conn: AsyncConnection, tenant_id: str, pool_id: str
) -> dict[str, dict[str, Decimal | None]]:
    """``{resource: {"limit": Decimal | None, "used": Decimal}}`` for the tenant in the pool."""
    rows = (
        await conn.execute(
            sa.select(quota_usage.c.resource, quota_usage.c.used, quota_limits.c.limit)
            .select_from(
                quota_usage.outerjoin(
                    quota_limits,
                    sa.and_(
                        quota_limits.c.tenant_id == quota_usage.c.tenant_id,
                        quota_limits.c.pool_id == quota_usage.c.pool_id,
                        quota_limits.c.resource == quota_usage.c.resource,
                    ),
                )
            )
            .where(quota_usage.c.tenant_id == tenant_id, quota_usage.c.pool_id == pool_id)
            .order_by(quota_usage.c.resource)
        )
    ).all()
    return {r.resource: {"limit": r.limit, "used": r.used} for r in rows}


async def _ensure_usage_rows(
    conn: AsyncConnection, tenant_id: str, pool_id: str, resources: list[str]
) -> None:
    if not resources:
        return
    await conn.execute(
        pg_insert(quota_usage)
        .values([{"tenant_id": tenant_id, "pool_id": pool_id, "resource": r, "used": 0} for r in resources])
        .on_conflict_do_nothing()
    )


async def charge(conn: AsyncConnection, tenant_id: str, pool_id: str, amounts: Mapping[str, Decimal]) -> None:
    """Add ``amounts`` to the tenant's usage, each under its limit, in sorted resource order.

    Raises :class:`~app.errors.QuotaExceeded` (409) naming the resource when one would pass its limit;
    the caller's transaction is then rolled back, so nothing is written.
    """
    wanted = {r: Decimal(n) for r, n in amounts.items() if Decimal(n) > 0}
    for resource, n in sorted(wanted.items()):
        row = await _guarded_add(conn, tenant_id, pool_id, resource, n)
        if row is None:
            # No row updated: over the limit, or no usage row yet, or one a concurrent first charge
            # created after this UPDATE's snapshot. INSERT ... ON CONFLICT DO NOTHING waits for such a
            # concurrent inserter to finish, so the retried UPDATE sees the row either way.
            await _ensure_usage_rows(conn, tenant_id, pool_id, [resource])
            row = await _guarded_add(conn, tenant_id, pool_id, resource, n)
        if row is None:
            QUOTA_REJECTIONS.inc()
            state = (await get_quota(conn, tenant_id, pool_id)).get(resource, {})
            raise QuotaExceeded(
                f"quota for {resource} in pool {pool_id} exceeded: {state.get('used')} used of "
                f"{state.get('limit')}, {n} requested",
                {
                    "tenantId": tenant_id,
                    "poolId": pool_id,
                    "resource": resource,
                    "limit": str(state.get("limit")),
                    "used": str(state.get("used")),
                    "requested": str(n),
                },
            )


def _usage_row(tenant_id: str, pool_id: str, resource: str) -> tuple[Any, ...]:
    """The key of one ``quota_usage`` row."""
    return (
        quota_usage.c.tenant_id == tenant_id,
        quota_usage.c.pool_id == pool_id,
        quota_usage.c.resource == resource,
    )


async def _guarded_add(conn: AsyncConnection, tenant_id: str, pool_id: str, resource: str, n: Decimal) -> Any:
    limit = (
        sa.select(quota_limits.c.limit)
        .where(
            quota_limits.c.tenant_id == tenant_id,
            quota_limits.c.pool_id == pool_id,
            quota_limits.c.resource == resource,
        )
        .scalar_subquery()
    )
    # UPDATE quota_usage SET used = used + :n
    #  WHERE tenant_id = :t AND pool_id = :p AND resource = :r
    #    AND (limit IS NULL OR used + :n <= limit) RETURNING used   -- no row: over the limit (or no row yet)
    return (
        await conn.execute(
            sa.update(quota_usage)
            .where(
                *_usage_row(tenant_id, pool_id, resource),
                sa.or_(limit.is_(None), quota_usage.c.used + n <= limit),
            )
            .values(used=quota_usage.c.used + n)
            .returning(quota_usage.c.used)
        )
    ).first()


async def refund(conn: AsyncConnection, tenant_id: str, pool_id: str, amounts: Mapping[str, Decimal]) -> None:
    """Subtract ``amounts`` from usage (never below zero), in sorted resource order."""
    for resource, n in sorted((r, Decimal(n)) for r, n in amounts.items()):
        if n <= 0:
            continue
        await conn.execute(
            sa.update(quota_usage)
            .where(*_usage_row(tenant_id, pool_id, resource))
            .values(used=sa.func.greatest(quota_usage.c.used - n, 0))
        )


async def _pool_exists(conn: AsyncConnection, pool_id: str) -> None:
    if (await conn.execute(sa.select(pools.c.id).where(pools.c.id == pool_id))).first() is None:
        raise NotFound(f"pool {quote_input(pool_id)} not found")


async def quota_view(conn: AsyncConnection, tenant_id: str, pool_id: str) -> dict[str, Any]:
    """``{tenantId, poolId, limits: {resource: n}, used: {resource: n}}``; NotFound for an unknown pool."""
    await _pool_exists(conn, pool_id)
    state = await get_quota(conn, tenant_id, pool_id)
    return {
        "tenantId": tenant_id,
        "poolId": pool_id,
        "limits": {r: num(v["limit"]) for r, v in state.items() if v["limit"] is not None},
        "used": {r: num(v["used"]) for r, v in state.items()},
    }


async def replace_limits(
    conn: AsyncConnection, tenant_id: str, pool_id: str, limits: Mapping[str, Decimal]
) -> dict[str, Any]:
    """:func:`set_limits` on an existing pool, answering :func:`quota_view`."""
    await _pool_exists(conn, pool_id)
    await set_limits(conn, tenant_id, pool_id, limits)
    return await quota_view(conn, tenant_id, pool_id)
