"""Assumed bookings: while one plan of this process is committing, the others plan around its atoms, so
two concurrent requests of one replica do not reach for the same GPU and lose a race (the "assume" step
of the Kubernetes scheduler cache; the guarded commit still decides)."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.config import CapacityConfig
from app.capacity.placing.inline import Placed, place_inline
from app.capacity.planning.snapshot import PoolCache
from app.capacity.reservations.create import create_reservation
from app.placement.model import DeviceRequest, PlacementRequest
from app.placement.options import SchedulerOptions
from app.placement.request import ReservationRequest
from tests.capacity.helpers import day_after, db_time, make_pool_with_nodes, reservation_row
from tests.factories import node_body


async def test_a_second_plan_avoids_atoms_being_committed(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, views = await make_pool_with_nodes(engine, [node_body(f"as{i}", 1) for i in range(2)])
    cache, options = PoolCache(), SchedulerOptions(top_n=1)  # both would pick the same node
    start = await db_time(engine)
    paused, resume = asyncio.Event(), asyncio.Event()
    attempts: list[int] = []

    async def hold(attempt: int, candidate: Any) -> None:
        attempts.append(attempt)
        paused.set()
        await resume.wait()

    async def first() -> Any:
        async with engine.begin() as conn:
            res = await reservation_row(conn, pool)
            request = PlacementRequest(
                "acme", pool, (DeviceRequest("gpu", 1),), start=start, end=day_after(start)
            )
            return await place_inline(conn, cache, request, res, options, 3, before_commit=hold)

    task = asyncio.create_task(first())
    await paused.wait()
    assert cache.assumed(pool, start, day_after(start)) == {views[0].id: {"as0-GPU0"}}
    body = ReservationRequest.model_validate(
        {
            "tenantId": "acme",
            "poolId": pool,
            "devices": [{"class": "gpu", "count": 1}],
            "duration": "1h",
            "idempotencyKey": "second",
        }
    )
    second, _ = await create_reservation(engine, cache, CapacityConfig(options), body)
    resume.set()
    placed = await task
    assert isinstance(placed, Placed) and placed.allocations[0].node_id == views[0].id
    assert second.status == "placed" and second.allocations[0].nodeId == views[1].id
    assert attempts == [1]  # the first never lost a race: the second planned around it
    for token in placed.assumptions:
        cache.forget(pool, token)
    assert cache.assumed(pool, start, day_after(start)) == {}
