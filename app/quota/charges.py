"""Quota charges: a reservation's amounts held over its window, each only if the tenant's limit holds at
every instant of it (docs/quota.md, "Usage is counted per instant").

A charge is one guarded ``INSERT INTO quota_holdings ... WHERE limit IS NULL OR peak + n <= limit
RETURNING`` (:data:`HOLD_QUOTA`; :data:`HOLD_QUOTA_ROWS` for the many reservations of a batch), run by
the guarded commit of the placement itself (app/capacity/commit/single.py) or by :func:`charge`; an
extension's charge lengthens the reservation's holdings under the same guard (:data:`EXTEND_QUOTA`,
:func:`extend_charge`; docs/lifecycle.md, "Extend"); a
resource missing from what it returns is over its limit somewhere in the window, and
:func:`refusal` makes its 409.

The guard reads every holding committed before it because the tenant's ``quota_usage`` rows of the
charged resources are locked first (:data:`LOCK_USAGE`, ``FOR UPDATE``): last in the lock order (pools ->
nodes -> devices -> node_resources -> quota_usage, docs/lifecycle.md, "Lock order"), so a tenant's row is
held from the commit's lock statement to COMMIT only, and always in sorted resource order, so two charges
never deadlock. What a charge gives back is in app/quota/refunds.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.prepared import Prepared
from app.db.tables import TS, quota_holdings, quota_limits, quota_usage
from app.db.unnest import bound_rows, wanted_amounts
from app.db.windows import hold_if, peak_instant, room_for
from app.errors import QuotaExceeded
from app.jsonnum import num
from app.observability.metrics import QUOTA_REJECTIONS
from app.quota.view import tenant_holdings


async def ensure_usage_rows(
    conn: AsyncConnection, tenant_id: str, pool_id: str, resources: list[str]
) -> None:
    """Insert the tenant's missing ``quota_usage`` rows of ``resources`` in the pool (the rows a charge
    locks, and the resources the quota view lists); ``ON CONFLICT DO NOTHING`` waits for a concurrent
    inserter of the same row to finish."""
    if not resources:
        return
    await conn.execute(
        pg_insert(quota_usage)
        .values([{"tenant_id": tenant_id, "pool_id": pool_id, "resource": r} for r in resources])
        .on_conflict_do_nothing()
    )


# SELECT resource FROM quota_usage WHERE tenant_id = :tenant_id AND pool_id = :pool_id
#    AND resource = ANY(:resources) ORDER BY resource FOR UPDATE   -- sorted: two charges never deadlock
LOCK_USAGE = (
    sa.select(quota_usage.c.resource)
    .where(
        quota_usage.c.tenant_id == sa.bindparam("tenant_id", type_=sa.Text),
        quota_usage.c.pool_id == sa.bindparam("pool_id", type_=sa.Text),
        quota_usage.c.resource == sa.any_(sa.bindparam("resources", type_=pg.ARRAY(sa.Text))),
    )
    .order_by(quota_usage.c.resource)
    .with_for_update()
)


async def _lock_usage_rows(conn: AsyncConnection, tenant_id: str, pool_id: str, resources: list[str]) -> int:
    params = {"tenant_id": tenant_id, "pool_id": pool_id, "resources": resources}
    return len((await conn.execute(LOCK_USAGE, params)).all())


async def charge(
    conn: AsyncConnection,
    tenant_id: str,
    pool_id: str,
    reservation_id: str,
    amounts: Mapping[str, Decimal],
    start: datetime,
    end: datetime,
) -> None:
    """Hold ``amounts`` for the reservation over ``[start, end)``, each only if the tenant's usage stays
    within its limit at every instant of the window, in sorted resource order.

    The tenant's ``quota_usage`` rows are locked (``FOR UPDATE``, last in the lock order: the caller
    holds the pool row and node locks, if any, already), so
    charges of one tenant, pool and resource are serialized and each guard reads, with a snapshot taken
    after the lock, every holding committed before it. Raises :class:`~app.errors.QuotaExceeded` (409)
    naming the resource, the instant of the peak, what is used there, the limit and what was requested;
    the caller's transaction is then rolled back, so nothing is written.
    """
    wanted = {r: Decimal(n) for r, n in amounts.items() if Decimal(n) > 0}
    if not wanted:
        return
    resources = sorted(wanted)
    await lock_usage_rows(conn, tenant_id, pool_id, resources)
    params = hold_params(tenant_id, pool_id, reservation_id, wanted, start, end)
    held = set((await conn.execute(HOLD_QUOTA, params)).scalars())  # one statement for all resources
    refused = next((r for r in resources if r not in held), None)  # the first refused, in sorted order
    if refused is not None:
        raise await refusal(conn, tenant_id, pool_id, refused, wanted[refused], start, end)


async def lock_usage_rows(conn: AsyncConnection, tenant_id: str, pool_id: str, resources: list[str]) -> None:
    """Lock the tenant's ``quota_usage`` rows of ``resources`` (sorted) to the end of the transaction,
    inserting the missing ones first (:func:`lock_first_usage_rows`): the lock of a charge."""
    if await _lock_usage_rows(conn, tenant_id, pool_id, resources) < len(resources):
        await lock_first_usage_rows(conn, tenant_id, pool_id, resources)


async def lock_first_usage_rows(
    conn: AsyncConnection, tenant_id: str, pool_id: str, resources: list[str]
) -> None:
    """A first charge of these resources (the guarded commit's lock found fewer ``quota_usage`` rows):
    insert them (``ON CONFLICT DO NOTHING`` waits for a concurrent inserter of the same row to finish)
    and lock them all, in sorted order."""
    await ensure_usage_rows(conn, tenant_id, pool_id, resources)
    await _lock_usage_rows(conn, tenant_id, pool_id, resources)


async def refusal(
    conn: AsyncConnection,
    tenant_id: str,
    pool_id: str,
    resource: str,
    n: Decimal,
    start: datetime,
    end: datetime,
) -> QuotaExceeded:
    """The 409 of a refused charge of ``n`` ``resource`` over ``[start, end)``: names the resource, the
    instant of the peak, what is used there, the limit and what was requested (counted in
    ``bc_quota_rejections_total``)."""
    limit = await _limit(conn, tenant_id, pool_id, resource)
    at, used = await peak_instant(
        conn, quota_holdings, tenant_holdings(tenant_id, pool_id, resource), start, end
    )
    QUOTA_REJECTIONS.inc()
    return QuotaExceeded(
        f"quota for {resource} in pool {pool_id} exceeded at {at.isoformat()}: {num(Decimal(used))} "
        f"used of {num(limit)}, {num(n)} requested",
        {
            "tenantId": tenant_id,
            "poolId": pool_id,
            "resource": resource,
            "at": at.isoformat(),
            "limit": num(limit),
            "used": num(Decimal(used)),
            "requested": num(n),
        },
    )


def _limit_of(tenant_id: str, pool_id: str, resource: str) -> Any:
    return (
        sa.select(quota_limits.c.limit)
        .where(
            quota_limits.c.tenant_id == tenant_id,
            quota_limits.c.pool_id == pool_id,
            quota_limits.c.resource == resource,
        )
        .scalar_subquery()
    )


async def _limit(conn: AsyncConnection, tenant_id: str, pool_id: str, resource: str) -> Decimal | None:
    return (await conn.execute(sa.select(_limit_of(tenant_id, pool_id, resource)))).scalar()


_P = {c: sa.bindparam(c, type_=quota_holdings.c[c].type) for c in ("reservation_id", "tenant_id", "pool_id")}
_WINDOW = (sa.bindparam("starts_at", type_=TS), sa.bindparam("ends_at", type_=TS))
# one row per resource charged: unnest(:resources, :amounts) AS wanted(resource, amount)
_WANTED = wanted_amounts("resources", "amounts")
_LIMIT = (
    sa.select(quota_limits.c.limit)
    .where(
        quota_limits.c.tenant_id == _P["tenant_id"],
        quota_limits.c.pool_id == _P["pool_id"],
        quota_limits.c.resource == _WANTED.c.resource,
    )
    .scalar_subquery()
)
# INSERT INTO quota_holdings (reservation_id, resource, tenant_id, pool_id, amount, starts_at, ends_at)
# SELECT :reservation_id, w.resource, :tenant_id, :pool_id, w.amount, :starts_at, :ends_at
#   FROM unnest(:resources, :amounts) AS wanted(resource, amount)
#  WHERE (SELECT limit ... = wanted.resource) IS NULL
#     OR (<peak of the tenant's wanted.resource holdings over [:starts_at, :ends_at), app/db/windows.py>)
#        + wanted.amount <= (SELECT limit ...)           -- windows.room_for: the sweep only if needed
# RETURNING resource                                     -- a resource missing: over its limit somewhere
HOLD_QUOTA = (
    sa.insert(quota_holdings)
    .from_select(
        ["reservation_id", "resource", "tenant_id", "pool_id", "amount", "starts_at", "ends_at"],
        sa.select(
            _P["reservation_id"],
            _WANTED.c.resource,
            _P["tenant_id"],
            _P["pool_id"],
            _WANTED.c.amount,
            *_WINDOW,
        )
        .select_from(_WANTED)
        .where(
            room_for(
                quota_holdings,
                [
                    quota_holdings.c.tenant_id == _P["tenant_id"],
                    quota_holdings.c.pool_id == _P["pool_id"],
                    quota_holdings.c.resource == _WANTED.c.resource,
                ],
                *_WINDOW,
                _WANTED.c.amount,
                _LIMIT,
                (_WANTED,),
            )
        ),
    )
    .returning(quota_holdings.c.resource)
)


_CHARGES = bound_rows(
    "w",
    ("reservation_id", "reservation_ids", sa.Text),
    ("tenant_id", "tenant_ids", sa.Text),
    ("resource", "resources", sa.Text),
    ("amount", "amounts", sa.Numeric),
    ("starts_at", "starts", TS),
    ("ends_at", "ends", TS),
    ("total", "totals", sa.Numeric),
)
_ROW_LIMIT = (
    sa.select(quota_limits.c.limit)
    .where(
        quota_limits.c.tenant_id == _CHARGES.c.tenant_id,
        quota_limits.c.pool_id == _P["pool_id"],
        quota_limits.c.resource == _CHARGES.c.resource,
    )
    .scalar_subquery()
)
# The charges of many reservations of one pool in one statement (a batch, app/quota/batch_charge.py),
# one row
# per (reservation, resource), each guarded with the total of its (tenant, resource) group (the
# statement does not see its own rows; the caller groups only charges of one window per tenant and
# resource, and holds their quota_usage rows locked):
# INSERT INTO quota_holdings (reservation_id, resource, tenant_id, pool_id, amount, starts_at, ends_at)
# SELECT w.reservation_id, w.resource, w.tenant_id, :pool_id, w.amount, w.starts_at, w.ends_at
#   FROM unnest(:reservation_ids, :tenant_ids, :resources, :amounts, :starts, :ends, :totals)
#        AS w(reservation_id, tenant_id, resource, amount, starts_at, ends_at, total)
#  WHERE (SELECT limit ...) IS NULL
#     OR (<peak of the tenant's w.resource holdings over the window>) + w.total <= (SELECT limit ...)
# RETURNING reservation_id, resource                 -- a group missing: over its limit somewhere
HOLD_QUOTA_ROWS = Prepared(
    hold_if(
        quota_holdings,
        {
            "reservation_id": _CHARGES.c.reservation_id,
            "resource": _CHARGES.c.resource,
            "tenant_id": _CHARGES.c.tenant_id,
            "pool_id": _P["pool_id"],
            "amount": _CHARGES.c.amount,
            "starts_at": _CHARGES.c.starts_at,
            "ends_at": _CHARGES.c.ends_at,
        },
        room_for(
            quota_holdings,
            [
                quota_holdings.c.tenant_id == _CHARGES.c.tenant_id,
                quota_holdings.c.pool_id == _P["pool_id"],
                quota_holdings.c.resource == _CHARGES.c.resource,
            ],
            _CHARGES.c.starts_at,
            _CHARGES.c.ends_at,
            _CHARGES.c.total,
            _ROW_LIMIT,
            (_CHARGES,),
        ),
        returning=("reservation_id", "resource"),
    )
)


def hold_params(
    tenant_id: str,
    pool_id: str,
    reservation_id: str,
    wanted: Mapping[str, Decimal],
    start: datetime,
    end: datetime,
) -> dict[str, Any]:
    """The bind parameters of :data:`HOLD_QUOTA` (and :data:`LOCK_USAGE`), resources sorted."""
    resources = sorted(wanted)
    return {
        "reservation_id": reservation_id,
        "tenant_id": tenant_id,
        "pool_id": pool_id,
        "resources": resources,
        "amounts": [wanted[r] for r in resources],
        "starts_at": start,
        "ends_at": end,
    }


_MINE = quota_holdings.alias("mine")
_EXT = {
    c: sa.bindparam(f"ext_{c}", type_=t)
    for c, t in (("reservation_id", sa.Text), ("old_end", TS), ("new_end", TS))
}
_MINE_LIMIT = (
    sa.select(quota_limits.c.limit)
    .where(
        quota_limits.c.tenant_id == _MINE.c.tenant_id,
        quota_limits.c.pool_id == _MINE.c.pool_id,
        quota_limits.c.resource == _MINE.c.resource,
    )
    .scalar_subquery()
)
_MINE_FITS = (
    sa.select(_MINE.c.resource)
    .where(
        _MINE.c.reservation_id == _EXT["reservation_id"],
        _MINE.c.ends_at == _EXT["old_end"],
        room_for(
            quota_holdings,
            [
                quota_holdings.c.tenant_id == _MINE.c.tenant_id,
                quota_holdings.c.pool_id == _MINE.c.pool_id,
                quota_holdings.c.resource == _MINE.c.resource,
            ],
            _EXT["old_end"],
            _EXT["new_end"],
            _MINE.c.amount,
            _MINE_LIMIT,
            (_MINE,),
        ),
    )
    .cte("fits")
)
# The charge of an extension (docs/lifecycle.md, "Extend"): the reservation's holdings that end at
# :old_end end at :new_end, each only if the tenant's usage stays within its limit at every instant of
# [:old_end, :new_end) (its own row ends at :old_end, so it never counts against its extension):
# WITH fits AS (SELECT mine.resource FROM quota_holdings mine
#                WHERE mine.reservation_id = :ext_reservation_id AND mine.ends_at = :ext_old_end
#                  AND ((SELECT limit ...) IS NULL
#                       OR (<peak of the tenant's mine.resource holdings over [:ext_old_end, :ext_new_end)>)
#                          + mine.amount <= (SELECT limit ...)))
# UPDATE quota_holdings SET ends_at = :ext_new_end
#  WHERE reservation_id = :ext_reservation_id AND ends_at = :ext_old_end
#    AND resource IN (SELECT resource FROM fits)
# RETURNING resource                                      -- one missing: over its limit somewhere
EXTEND_QUOTA = (
    sa.update(quota_holdings)
    .where(
        quota_holdings.c.reservation_id == _EXT["reservation_id"],
        quota_holdings.c.ends_at == _EXT["old_end"],
        quota_holdings.c.resource.in_(sa.select(_MINE_FITS.c.resource)),
    )
    .values(ends_at=_EXT["new_end"])
    .returning(quota_holdings.c.resource)
)


async def extend_charge(
    conn: AsyncConnection,
    tenant_id: str,
    pool_id: str,
    reservation_id: str,
    old_end: datetime,
    new_end: datetime,
) -> None:
    """Charge the extension of a reservation's window from ``old_end`` to ``new_end``: its quota
    holdings that end at ``old_end`` end at ``new_end``, each only where the tenant's limit holds at
    every instant of ``[old_end, new_end)`` (:data:`EXTEND_QUOTA`). The tenant's ``quota_usage`` rows
    of those resources are locked first (``FOR UPDATE``, sorted, last in the lock order), as a charge's
    are. Raises :class:`~app.errors.QuotaExceeded` (409, :func:`refusal`) for the first refused resource
    in sorted order; the caller's transaction is then rolled back, so nothing is written."""
    rows = await conn.execute(
        sa.select(quota_holdings.c.resource, quota_holdings.c.amount).where(
            quota_holdings.c.reservation_id == reservation_id, quota_holdings.c.ends_at == old_end
        )
    )
    wanted = {r.resource: Decimal(r.amount) for r in rows}
    if not wanted:
        return
    resources = sorted(wanted)
    await lock_usage_rows(conn, tenant_id, pool_id, resources)
    params = {"ext_reservation_id": reservation_id, "ext_old_end": old_end, "ext_new_end": new_end}
    held = set((await conn.execute(EXTEND_QUOTA, params)).scalars())
    refused = next((r for r in resources if r not in held), None)
    if refused is not None:
        raise await refusal(conn, tenant_id, pool_id, refused, wanted[refused], old_end, new_end)
