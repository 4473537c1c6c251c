"""Helpers for capacity tests that call the services directly on real PostgreSQL."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from decimal import Decimal

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.answers.inventory import Node
from app.db.tables import allocations, device_bookings, devices, reservations, scalar_holdings
from app.db.windows import window
from app.ids import new_id
from app.inventory import service as inventory
from app.inventory.schemas import NodeCreate
from tests.factories import node_body  # noqa: F401 (its one home; re-exported for older imports)

_names = itertools.count()


async def make_pool_with_nodes(engine: AsyncEngine, bodies: list[NodeCreate]) -> tuple[str, list[Node]]:
    """Create a pool holding ``bodies``; returns (pool id, node views)."""
    async with engine.begin() as conn:
        pool = await inventory.create_pool(conn, f"pool-{next(_names)}-{new_id('t')[-6:]}")
        views = [await inventory.add_node(conn, pool.id, b) for b in bodies]
    return pool.id, views


async def reservation_row(conn: AsyncConnection, pool_id: str, tenant: str = "acme") -> str:
    """Insert a bare reservation row (allocations need one) and return its id."""
    res_id = new_id("res")
    await conn.execute(
        sa.insert(reservations).values(
            id=res_id,
            tenant_id=tenant,
            pool_id=pool_id,
            status="pending",
            spec={},
            spec_hash="-",
            idempotency_key=res_id,
        )
    )
    return res_id


async def book(
    conn: AsyncConnection,
    pool_id: str,
    node_id: str,
    atoms: list[str],
    start: datetime,
    end: datetime,
    resources: dict[str, Decimal | int] | None = None,
) -> str:
    """Write an allocation with bookings of ``atoms`` and holdings of ``resources`` for ``[start, end)``
    (test set-up; no guard)."""
    res_id = await reservation_row(conn, pool_id, tenant="someone-else")
    alloc_id = new_id("alloc")
    await conn.execute(
        sa.insert(allocations).values(
            id=alloc_id,
            reservation_id=res_id,
            pool_id=pool_id,
            node_id=node_id,
            atoms=atoms,
            resources={k: str(v) for k, v in (resources or {}).items()},
            during=window(start, end),
        )
    )
    if resources:
        await conn.execute(
            sa.insert(scalar_holdings),
            [
                {
                    "allocation_id": alloc_id,
                    "resource": r,
                    "node_id": node_id,
                    "pool_id": pool_id,
                    "amount": Decimal(n),
                    "starts_at": start,
                    "ends_at": end,
                }
                for r, n in sorted(resources.items())
            ],
        )
    if not atoms:
        return alloc_id
    pks = dict(
        (await conn.execute(sa.select(devices.c.id, devices.c.pk).where(devices.c.id.in_(atoms)))).all()
    )
    await conn.execute(
        sa.insert(device_bookings),
        [
            {
                "device_pk": pks[a],
                "device_id": a,
                "pool_id": pool_id,
                "allocation_id": alloc_id,
                "during": window(start, end),
            }
            for a in atoms
        ],
    )
    return alloc_id


async def db_time(engine: AsyncEngine) -> datetime:
    async with engine.connect() as conn:
        return (await conn.exec_driver_sql("SELECT now()")).scalar_one()


def day_after(start: datetime) -> datetime:
    return start + timedelta(days=1)


ZERO = Decimal(0)


async def held_now(engine: AsyncEngine, table: str, where: str = "true") -> Decimal:
    """``sum(amount)`` of the ``scalar_holdings`` / ``quota_holdings`` rows matching ``where`` that
    hold at the database's ``now()``."""
    async with engine.connect() as conn:
        return (
            await conn.exec_driver_sql(
                f"SELECT coalesce(sum(amount), 0) FROM {table} "
                f"WHERE starts_at <= now() AND ends_at > now() AND {where}"
            )
        ).scalar_one()


async def overlapping_bookings(conn: AsyncConnection) -> int:
    """Pairs of bookings of one atom by two allocations that overlap in time (double bookings; the
    exclusion constraint forbids them too): must be 0."""
    return (
        await conn.execute(
            sa.text(
                """SELECT count(*) FROM device_bookings x JOIN device_bookings y
                       ON x.device_id = y.device_id AND x.allocation_id < y.allocation_id
                      AND x.during && y.during"""
            )
        )
    ).scalar_one()
