"""Inventory changes racing placements for real (several connections, one PostgreSQL): once a cordon,
a foreign dedication, an unhealthy atom or a pool archive has committed, no placement that lands after it
uses what it took away (docs/placement-rules.md, "Commit and lock order": the guarded commit locks the node
and atoms
FOR SHARE and the pool FOR SHARE; those changes take the rows FOR UPDATE, so either the placement
committed first or its guarded statement sees the change and loses the race)."""

from __future__ import annotations

import asyncio
import random

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.answers.inventory import Node
from app.answers.reservations import Reservation
from app.capacity.config import CapacityConfig
from app.capacity.planning.snapshot import PoolCache
from app.capacity.reservations.create import create_reservation
from app.db.tables import allocations, device_bookings
from app.inventory import service as inventory
from app.inventory.schemas import HealthBody, TaintBody
from app.placement.options import SchedulerOptions
from app.placement.request import ReservationRequest
from tests.capacity.helpers import make_pool_with_nodes
from tests.factories import node_body

CLIENTS = 24


def _body(pool: str, i: int) -> ReservationRequest:
    return ReservationRequest.model_validate(
        {
            "tenantId": "acme",
            "poolId": pool,
            "devices": [{"class": "gpu", "count": 1}],
            "resources": {"cpu": 1},
            "duration": "1h",
            "idempotencyKey": f"race-{i}",
        }
    )


async def _change(engine: AsyncEngine, kind: str, pool: str, node: Node) -> None:
    async with engine.begin() as conn:
        if kind == "cordon":
            await inventory.set_cordon(conn, node.id, True)
        elif kind == "dedication":
            await inventory.set_taints(conn, node.id, [TaintBody(key="dedicated", value="globex")])
        elif kind == "health":
            body = HealthBody.model_validate(
                {"devices": [{"id": d.id, "healthy": False} for d in node.devices]}
            )
            await inventory.set_health(conn, node.id, body)
        else:
            await inventory.archive_pool(conn, pool)


async def _taken(engine: AsyncEngine, pool: str, node_id: str | None) -> set[str]:
    """Allocation ids live on the node (or in the pool) now."""
    where = [allocations.c.pool_id == pool]
    if node_id is not None:
        where.append(allocations.c.node_id == node_id)
    async with engine.connect() as conn:
        return set((await conn.execute(sa.select(allocations.c.id).where(*where))).scalars())


@pytest.mark.parametrize("kind", ["cordon", "dedication", "health", "archive"])
async def test_nothing_lands_after_a_committed_change(clean_db: AsyncEngine, kind: str) -> None:
    engine = clean_db
    pool, views = await make_pool_with_nodes(
        engine, [node_body(f"{kind[:3]}{i}", 8, cpu=64) for i in range(3)]
    )
    target = views[0]
    config = CapacityConfig(SchedulerOptions(top_n=3))
    cache = PoolCache()
    rng = random.Random(kind)
    frozen: dict[str, set[str]] = {}

    async def client(i: int) -> Reservation:
        await asyncio.sleep(rng.random() * 0.05)
        view, _ = await create_reservation(engine, cache, config, _body(pool, i))
        return view

    async def change() -> None:
        await asyncio.sleep(0.02)
        await _change(engine, kind, pool, target)
        # committed: what is on the node (the pool, for an archive) now is final for this race
        frozen["after"] = await _taken(engine, pool, None if kind == "archive" else target.id)

    results = await asyncio.gather(*(client(i) for i in range(CLIENTS)), change())
    views_out = [r for r in results if isinstance(r, Reservation)]
    assert len(views_out) == CLIENTS
    final = await _taken(engine, pool, None if kind == "archive" else target.id)
    assert final == frozen["after"], f"{kind}: placements landed after the change committed"
    assert all(v.status in ("placed", "pending") for v in views_out)
    async with engine.connect() as conn:  # and nothing double-booked along the way
        overlaps = (
            await conn.execute(
                sa.text(
                    "SELECT count(*) FROM device_bookings a JOIN device_bookings b"
                    " ON a.device_pk = b.device_pk "
                    "AND a.allocation_id < b.allocation_id AND a.during && b.during"
                )
            )
        ).scalar_one()
        booked = (await conn.execute(sa.select(sa.func.count()).select_from(device_bookings))).scalar_one()
    assert overlaps == 0
    assert booked == sum(1 for v in views_out if v.status == "placed")
    reasons = {v.conditions[0].message.split(":")[0] for v in views_out if v.status == "pending"}
    # a pending answer is the archive, the change, or a full pool after a lost race, never an error
    assert reasons <= {
        "the pool is archived",
        "no node fits (3 nodes)",
        "Unschedulable after 3 conflicting attempts",
    }
