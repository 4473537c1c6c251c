"""Quota reads: a tenant's limits and what it holds in a pool, now and at its peak over the next days
(docs/quota.md, "The quota view" and "Usage is counted per instant").

A resource without a limit row is not limited (its usage is still counted), as a Kubernetes namespace
without a ResourceQuota is not. What a tenant holds at an instant is the sum of its ``quota_holdings``
whose window contains it (app/db/windows.py). Nothing here locks or writes.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.answers.quota import PeakUse, PeakWindow, Quota
from app.db.locks import pool_not_found
from app.db.tables import pools, quota_holdings, quota_limits, quota_usage
from app.db.tx import reads
from app.db.windows import held_at, peak_instant
from app.jsonnum import num

PEAK_HORIZON = timedelta(days=7)  # the quota view's peak looks this far ahead


def tenant_holdings(tenant_id: str, pool_id: str, resource: str | None = None) -> list[Any]:
    """The ``WHERE`` terms of the tenant's ``quota_holdings`` in the pool (of one resource, if given)."""
    where = [quota_holdings.c.tenant_id == tenant_id, quota_holdings.c.pool_id == pool_id]
    if resource is not None:
        where.append(quota_holdings.c.resource == resource)
    return where


async def require_pool(conn: AsyncConnection, pool_id: str) -> None:
    """Raise :class:`~app.errors.NotFound` (``pool '<id>' not found``) unless the pool exists."""
    if (await conn.execute(sa.select(pools.c.id).where(pools.c.id == pool_id))).first() is None:
        raise pool_not_found(pool_id)


async def get_quota(
    conn: AsyncConnection, tenant_id: str, pool_id: str, now: datetime | None = None
) -> dict[str, dict[str, Decimal | None]]:
    """``{resource: {"limit": Decimal | None, "used": Decimal}}`` for the tenant in the pool, sorted by
    resource, ``used`` being what is held at ``now`` (default: the database clock). A resource is listed
    once the tenant has a ``quota_usage`` row of it (a limit was written, or it was charged)."""
    at = now if now is not None else sa.func.now()
    rows = (
        await conn.execute(
            sa.select(quota_usage.c.resource, quota_limits.c.limit)
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
    used = await held_at(
        conn, quota_holdings, tenant_holdings(tenant_id, pool_id), at, [quota_holdings.c.resource]
    )
    return {r.resource: {"limit": r.limit, "used": used.get((r.resource,), Decimal(0))} for r in rows}


@reads
async def quota_view(
    conn: AsyncConnection, tenant_id: str, pool_id: str, now: datetime | None = None
) -> Quota:
    """The tenant's :class:`~app.answers.quota.Quota` in the pool: ``limits`` and ``used`` (what is held at
    ``now``, default the database clock) by resource, amounts as JSON numbers, and ``peak``, the most held
    at any instant of the next 7 days (:data:`PEAK_HORIZON`) with the first instant it is held.
    Raises :class:`~app.errors.NotFound` for an unknown pool."""
    await require_pool(conn, pool_id)
    if now is None:
        now = (await conn.execute(sa.select(sa.func.now()))).scalar_one()
    assert now is not None
    horizon = now + PEAK_HORIZON
    state = await get_quota(conn, tenant_id, pool_id, now)
    peak: dict[str, PeakUse] = {}
    for resource in state:
        at, held = await peak_instant(
            conn, quota_holdings, tenant_holdings(tenant_id, pool_id, resource), now, horizon
        )
        peak[resource] = PeakUse(used=num(Decimal(held)), at=at.isoformat())
    return Quota(
        tenantId=tenant_id,
        poolId=pool_id,
        limits={r: num(v["limit"]) for r, v in state.items() if v["limit"] is not None},
        used={r: num(v["used"]) for r, v in state.items()},
        peak=peak,
        peakWindow=PeakWindow(start=now.isoformat(), end=horizon.isoformat()),
    )
