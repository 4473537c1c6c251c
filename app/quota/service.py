"""Quota: limits per tenant, pool and resource (a device class such as ``gpu``, or a scalar such as
``cpu``), counted per instant (docs/lifecycle.md).

A reservation holds its amounts over its window (``quota_holdings``); the tenant's usage at an instant is
the sum of the holdings whose window contains it, and a charge is accepted only if the limit holds at
every instant of the window (a guarded INSERT, :data:`HOLD_QUOTA`, run by the guarded commit of the
placement itself, app/capacity/commit/single.py). A reservation that ends stops counting
by itself; a release cuts its holdings at the release instant.

A resource without a limit row is not limited (its usage is still counted), as a Kubernetes namespace
without a ResourceQuota is not. ``quota_usage`` rows are locked last in every capacity transaction
(pools -> nodes -> devices -> node_resources -> quota_usage: issue 15 moved them from first to last so a
tenant's row is held from the commit's lock statement to COMMIT only), always in sorted resource order
so two charges never deadlock.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.edges import notify_pool
from app.db.locks import pool_not_found
from app.db.prepared import Prepared
from app.db.tables import (
    TS,
    devices,
    node_resources,
    nodes,
    pools,
    quota_holdings,
    quota_limits,
    quota_usage,
)
from app.db.tx import reads, transaction
from app.db.unnest import bound_rows, wanted_amounts
from app.db.windows import cut, held_at, peak_instant, room_for
from app.errors import InvalidInput, QuotaExceeded
from app.jsonnum import num
from app.observability.metrics import QUOTA_REJECTIONS

PEAK_HORIZON = timedelta(days=7)  # the quota view's peak looks this far ahead


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
    return before


# SELECT DISTINCT d.class FROM devices d JOIN nodes n ON n.id = d.node_id WHERE n.pool_id = :pool_id
_POOL_CLASSES = (
    sa.select(devices.c["class"])
    .distinct()
    .select_from(devices.join(nodes, nodes.c.id == devices.c.node_id))
    .where(nodes.c.pool_id == sa.bindparam("pool_id", type_=sa.Text))
)
# SELECT DISTINCT r.resource FROM node_resources r JOIN nodes n ON n.id = r.node_id WHERE n.pool_id = :pool_id
_POOL_SCALARS = (
    sa.select(node_resources.c.resource)
    .distinct()
    .select_from(node_resources.join(nodes, nodes.c.id == node_resources.c.node_id))
    .where(nodes.c.pool_id == sa.bindparam("pool_id", type_=sa.Text))
)


async def pool_resources(conn: AsyncConnection, pool_id: str) -> tuple[frozenset[str], frozenset[str], bool]:
    """``(device classes, scalar resources, has nodes)`` of the pool: the names some node of it has."""
    has_nodes = (await conn.execute(sa.select(sa.exists().where(nodes.c.pool_id == pool_id)))).scalar_one()
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


async def get_quota(
    conn: AsyncConnection, tenant_id: str, pool_id: str, now: datetime | None = None
) -> dict[str, dict[str, Decimal | None]]:
    """``{resource: {"limit": Decimal | None, "used": Decimal}}`` for the tenant in the pool, ``used``
    being what is held at ``now`` (default: the database clock)."""
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
    used = {
        r.resource: r.held
        for r in (
            await conn.execute(
                held_at(quota_holdings, _tenant(tenant_id, pool_id), at, [quota_holdings.c.resource])
            )
        ).all()
    }
    return {r.resource: {"limit": r.limit, "used": used.get(r.resource, Decimal(0))} for r in rows}


def _tenant(tenant_id: str, pool_id: str, resource: str | None = None) -> list[Any]:
    """The tenant's holdings in the pool (of one resource)."""
    where = [quota_holdings.c.tenant_id == tenant_id, quota_holdings.c.pool_id == pool_id]
    if resource is not None:
        where.append(quota_holdings.c.resource == resource)
    return where


async def _ensure_usage_rows(
    conn: AsyncConnection, tenant_id: str, pool_id: str, resources: list[str]
) -> None:
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
    await _ensure_usage_rows(conn, tenant_id, pool_id, resources)
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
    at, used = await peak_instant(conn, quota_holdings, _tenant(tenant_id, pool_id, resource), start, end)
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
    sa.insert(quota_holdings)
    .from_select(
        ["reservation_id", "resource", "tenant_id", "pool_id", "amount", "starts_at", "ends_at"],
        sa.select(
            _CHARGES.c.reservation_id,
            _CHARGES.c.resource,
            _CHARGES.c.tenant_id,
            _P["pool_id"],
            _CHARGES.c.amount,
            _CHARGES.c.starts_at,
            _CHARGES.c.ends_at,
        )
        .select_from(_CHARGES)
        .where(
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
            )
        ),
    )
    .returning(quota_holdings.c.reservation_id, quota_holdings.c.resource)
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


# DELETE FROM quota_holdings WHERE reservation_id = :reservation_id
REFUND = Prepared(
    sa.delete(quota_holdings).where(
        quota_holdings.c.reservation_id == sa.bindparam("reservation_id", type_=sa.Text)
    )
)


async def refund(conn: AsyncConnection, reservation_id: str) -> None:
    """Drop everything the reservation holds (it was charged and then could not be placed):
    :data:`REFUND`, prepared."""
    await REFUND.run(conn, {"reservation_id": reservation_id})


async def cut_holdings(conn: AsyncConnection, reservation_id: str, at: datetime) -> None:
    """A release at ``at``: the reservation's holdings end there (removed if they had not started)."""
    await cut(conn, quota_holdings, [quota_holdings.c.reservation_id == reservation_id], at)


async def drop_holdings(conn: AsyncConnection, reservation_id: str) -> None:
    """A reservation that goes back to ``pending`` (BookingRepair found no room) holds nothing, and is
    charged again for its new window when it is woken: its quota holdings are removed, not cut, since
    one row per reservation and resource holds its window (a cut row would collide with the new charge).
    The time it was placed stays on its allocations."""
    await refund(conn, reservation_id)  # DELETE FROM quota_holdings WHERE reservation_id = :id


async def _pool_exists(conn: AsyncConnection, pool_id: str) -> None:
    if (await conn.execute(sa.select(pools.c.id).where(pools.c.id == pool_id))).first() is None:
        raise pool_not_found(pool_id)


@reads
async def quota_view(
    conn: AsyncConnection, tenant_id: str, pool_id: str, now: datetime | None = None
) -> dict[str, Any]:
    """``{tenantId, poolId, limits: {resource: n}, used: {resource: n}, peak: {resource: {used, at}},
    peakWindow: {start, end}}``: ``used`` is what is held at ``now`` (default: the database clock), and
    ``peak`` the most held at any instant of the next 7 days, with the first instant it is held.
    NotFound for an unknown pool."""
    await _pool_exists(conn, pool_id)
    if now is None:
        now = (await conn.execute(sa.select(sa.func.now()))).scalar_one()
    assert now is not None
    horizon = now + PEAK_HORIZON
    state = await get_quota(conn, tenant_id, pool_id, now)
    peak: dict[str, dict[str, Any]] = {}
    for resource in state:
        at, held = await peak_instant(
            conn, quota_holdings, _tenant(tenant_id, pool_id, resource), now, horizon
        )
        peak[resource] = {"used": num(Decimal(held)), "at": at.isoformat()}
    return {
        "tenantId": tenant_id,
        "poolId": pool_id,
        "limits": {r: num(v["limit"]) for r, v in state.items() if v["limit"] is not None},
        "used": {r: num(v["used"]) for r, v in state.items()},
        "peak": peak,
        "peakWindow": {"start": now.isoformat(), "end": horizon.isoformat()},
    }


@transaction
async def replace_limits(
    conn: AsyncConnection, tenant_id: str, pool_id: str, limits: Mapping[str, Decimal]
) -> dict[str, Any]:
    """Replace the tenant's limits in an existing pool (PUT replaces, it does not merge: docs/quota.md,
    "Writing limits") and answer :func:`quota_view` with ``warnings``: the limits this write dropped,
    and, in a pool without nodes, the names not checked. Raises NotFound for an unknown pool and
    :class:`~app.errors.InvalidInput` (:func:`check_limits`) before anything is written."""
    await _pool_exists(conn, pool_id)
    warnings = check_limits(limits, *await pool_resources(conn, pool_id))
    before = await set_limits(conn, tenant_id, pool_id, limits)
    warnings += [
        f"limits.{name}: the limit of {num(before[name])} was removed: {name} is now unlimited"
        for name in sorted(set(before) - set(limits))
    ]
    await notify_pool(conn, pool_id, tenant_id)  # wake edge: the tenant's quota may have been raised
    return {**await quota_view(conn, tenant_id, pool_id), "warnings": warnings}
