"""A batch's quota charges (docs/quota.md, "Charging"; docs/scaling.md): many reservations' charges in
one transaction, exact as if each were charged alone with :func:`app.quota.charges.charge`.

- :func:`lock_usage` locks every tenant's ``quota_usage`` rows for all the charges at once, tenants and
  resources in sorted order (one statement, :data:`LOCK_BATCH_USAGE`, when the rows are known to exist);
  charging one after another would lock a tenant's rows in the charges' order and deadlock against a
  single charge taking them sorted;
- :func:`charge_together` writes every charge in one guarded statement
  (:data:`app.quota.charges.HOLD_QUOTA_ROWS`) when they all fit and one guard per window is exact;
- :func:`charge_one` charges (or only checks) one in a SAVEPOINT, answering the refusal.

A charge is anything with a :class:`Charge`'s fields (the commit's ``QuotaCharge``): the tenant, the pool,
the reservation, ``amounts`` (resource -> amount) and the window ``[start, end)``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.prepared import Prepared
from app.db.tables import quota_usage
from app.db.unnest import bound_rows
from app.db.windows import windows_apart
from app.errors import QuotaExceeded
from app.quota import charges as quota


class Charge(Protocol):
    """What a batch charges for one reservation: ``amounts`` (resource -> amount) over ``[start, end)``."""

    @property
    def tenant_id(self) -> str: ...
    @property
    def pool_id(self) -> str: ...
    @property
    def reservation_id(self) -> str: ...
    @property
    def amounts(self) -> Mapping[str, Decimal]: ...
    @property
    def start(self) -> datetime: ...
    @property
    def end(self) -> datetime: ...


@dataclass
class UsageLocks:
    """The ``quota_usage`` rows of a batch as ``(tenant, pool, resource)``: ``locked`` by this transaction
    already (outside any SAVEPOINT, so held to COMMIT), and ``known`` to exist (a queue worker's, kept
    across its batches of the pool)."""

    known: set[tuple[str, str, str]] = field(default_factory=set)
    locked: set[tuple[str, str, str]] = field(default_factory=set)


_USAGE_KEYS = bound_rows("k", ("tenant_id", "tenant_ids", sa.Text), ("resource", "resources", sa.Text))
# SELECT tenant_id, resource FROM quota_usage
#  WHERE pool_id = :pool_id AND (tenant_id, resource) IN (SELECT * FROM unnest(:tenant_ids, :resources))
#  ORDER BY tenant_id COLLATE "C", resource COLLATE "C" FOR UPDATE  -- Python's sorted order, as one by one
LOCK_BATCH_USAGE = Prepared(
    sa.select(quota_usage.c.tenant_id, quota_usage.c.resource)
    .where(
        quota_usage.c.pool_id == sa.bindparam("pool_id", type_=sa.Text),
        sa.tuple_(quota_usage.c.tenant_id, quota_usage.c.resource).in_(sa.select(_USAGE_KEYS)),
    )
    .order_by(quota_usage.c.tenant_id.collate("C"), quota_usage.c.resource.collate("C"))
    .with_for_update()
)


async def lock_usage(conn: AsyncConnection, charges: Sequence[Charge], locks: UsageLocks) -> None:
    """Lock every tenant's ``quota_usage`` rows for all the resources ``charges`` charge (amount > 0),
    tenants and resources in sorted order, as one charge locks them. Rows in ``locks.locked`` are not
    locked again; when every row left is known to exist, one statement locks them all; otherwise (a first
    charge of a tenant, or a row found missing) one tenant at a time, inserting missing rows."""
    wanted = {
        (c.tenant_id, c.pool_id, r) for c in charges for r, n in c.amounts.items() if Decimal(n) > 0
    } - locks.locked
    if not wanted:
        return
    keys = sorted(wanted)
    if wanted <= locks.known and len({k[1] for k in keys}) == 1:
        params = {
            "pool_id": keys[0][1],
            "tenant_ids": [k[0] for k in keys],
            "resources": [k[2] for k in keys],
        }
        if len((await LOCK_BATCH_USAGE.run(conn, params)).all()) == len(keys):
            locks.locked |= wanted
            return
    by_tenant: dict[tuple[str, str], list[str]] = defaultdict(list)
    for tenant, pool, resource in keys:
        by_tenant[(tenant, pool)].append(resource)
    for (tenant, pool), resources in sorted(by_tenant.items()):
        # SELECT resource FROM quota_usage WHERE tenant_id = :t AND pool_id = :p AND resource = ANY(:rs)
        #  ORDER BY resource FOR UPDATE  (missing rows inserted first)
        await quota.lock_usage_rows(conn, tenant, pool, resources)
    locks.locked |= wanted
    locks.known |= wanted


async def charge_together(conn: AsyncConnection, charges: Sequence[Charge], keep: bool) -> bool:
    """Every charge in one statement (:data:`app.quota.charges.HOLD_QUOTA_ROWS`) in a SAVEPOINT, their
    ``quota_usage`` rows locked already: True when all fit (kept, or with ``keep=False`` only checked and
    rolled back), which is what charging them one after another would have answered. False (rolled back,
    nothing changed) when one did not fit, or when one tenant charges one resource over windows that
    overlap without being equal (their guards would not see each other): the caller charges them one by
    one. Each row is guarded with the total of its (tenant, resource, window)."""
    rows = []
    totals: dict[tuple[str, str, Any, Any], Decimal] = defaultdict(Decimal)
    for c in charges:
        for resource, n in sorted(c.amounts.items()):
            if Decimal(n) > 0:
                rows.append((c.reservation_id, c.tenant_id, resource, Decimal(n), c.start, c.end))
                totals[(c.tenant_id, resource, c.start, c.end)] += Decimal(n)
    if not rows:
        return True
    if not windows_apart(totals):
        return False
    columns = [list(c) for c in zip(*rows, strict=True)]
    names = ("reservation_ids", "tenant_ids", "resources", "amounts", "starts", "ends")
    params: dict[str, Any] = dict(zip(names, columns, strict=True))
    params["totals"] = [totals[(row[1], row[2], row[4], row[5])] for row in rows]
    params["pool_id"] = charges[0].pool_id
    savepoint = await conn.begin_nested()
    # <HOLD_QUOTA_ROWS>: one row per (reservation, resource), guarded with its group's total
    held = len((await quota.HOLD_QUOTA_ROWS.run(conn, params)).all())
    if held == len(rows) and keep:
        await savepoint.commit()
    else:
        await savepoint.rollback()
    return held == len(rows)


async def charge_one(conn: AsyncConnection, c: Charge, keep: bool) -> QuotaExceeded | None:
    """Charge ``c`` in a SAVEPOINT (``keep=False``: only check, and roll the charge back); returns the
    refusal (:class:`~app.errors.QuotaExceeded`, nothing kept) or None."""
    savepoint = await conn.begin_nested()
    try:
        await quota.charge(conn, c.tenant_id, c.pool_id, c.reservation_id, c.amounts, c.start, c.end)
    except QuotaExceeded as exc:
        await savepoint.rollback()
        return exc
    if keep:
        await savepoint.commit()
    else:
        await savepoint.rollback()
    return None
