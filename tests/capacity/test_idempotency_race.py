"""Idempotency under races (issue 4): many concurrent creates with one key give one reservation; the
same key with another body is 409 IDEMPOTENCY_KEY_REUSED. Real concurrent connections, one PostgreSQL."""

from __future__ import annotations

import asyncio

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.config import CapacityConfig
from app.capacity.planning.snapshot import PoolCache
from app.capacity.reservations.create import create_reservation
from app.errors import IdempotencyKeyReused
from app.placement.options import SchedulerOptions
from app.placement.request import ReservationRequest
from tests.capacity.helpers import make_pool_with_nodes
from tests.factories import node_body


def _body(pool: str, gpus: int, key: str) -> ReservationRequest:
    return ReservationRequest.model_validate(
        {
            "tenantId": "acme",
            "poolId": pool,
            "devices": [{"class": "gpu", "count": gpus}],
            "duration": "2h",
            "idempotencyKey": key,
        }
    )


async def test_concurrent_creates_with_one_key_make_one_reservation(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body(f"i{i}", 8) for i in range(3)])
    config, cache = CapacityConfig(SchedulerOptions()), PoolCache()
    results = await asyncio.gather(
        *(create_reservation(engine, cache, config, _body(pool, 2, "same-key")) for _ in range(16))
    )
    ids = {view.id for view, _ in results}
    assert len(ids) == 1
    assert sum(1 for _, created in results if created) == 1
    assert all(view.status == "placed" for view, _ in results)
    async with engine.connect() as conn:
        assert (await conn.exec_driver_sql("SELECT count(*) FROM reservations")).scalar_one() == 1
        assert (await conn.exec_driver_sql("SELECT count(*) FROM device_bookings")).scalar_one() == 2
        assert (
            await conn.exec_driver_sql("SELECT sum(amount) FROM quota_holdings WHERE resource = 'gpu'")
        ).scalar_one() == 2


async def test_concurrent_creates_with_one_key_and_other_bodies_conflict(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body(f"j{i}", 8) for i in range(3)])
    config, cache = CapacityConfig(SchedulerOptions()), PoolCache()
    outcomes = await asyncio.gather(
        *(create_reservation(engine, cache, config, _body(pool, 1 + i % 2, "k2")) for i in range(12)),
        return_exceptions=True,
    )
    winners = [o for o in outcomes if not isinstance(o, BaseException)]
    losers = [o for o in outcomes if isinstance(o, BaseException)]
    assert all(isinstance(e, IdempotencyKeyReused) for e in losers), losers
    assert len({view.id for view, _ in winners}) == 1
    [count] = {len(view.allocations[0].atoms) for view, _ in winners}
    assert len(losers) == 6 and len(winners) == 6  # the six with the winner's body got its reservation
    async with engine.connect() as conn:
        booked = (await conn.execute(sa.text("SELECT count(*) FROM device_bookings"))).scalar_one()
    assert booked == count
