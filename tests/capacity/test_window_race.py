"""The windowed guards raced for real (issue 11): many concurrent transactions hold cpu and quota over
random overlapping windows on one node; the per-instant sweep finds no instant over capacity or limit,
and a release racing the creates only frees what it cut."""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta
from decimal import Decimal

from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.config import CapacityConfig
from app.capacity.planning.snapshot import PoolCache
from app.capacity.reservations.create import create_reservation
from app.capacity.reservations.release import release_reservation
from app.errors import QuotaExceeded
from app.placement.options import SchedulerOptions
from app.placement.request import ReservationRequest
from app.quota.limits import set_limits
from tests.capacity.helpers import db_time, make_pool_with_nodes
from tests.capacity.invariants import CHECKS
from tests.factories import node_body

CLIENTS = 24
SWEEPS = (
    "scalar over capacity at an instant",
    "quota over limit at an instant",
    "scalar holdings != allocations",
)


async def test_concurrent_windows_never_overcommit_an_instant(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body("race", 0, cpu=10)])
    async with engine.begin() as conn:
        await set_limits(conn, "capped", pool, {"cpu": Decimal(7)})
    base = (await db_time(engine)) + timedelta(minutes=5)
    rng = random.Random(11)
    config = CapacityConfig(SchedulerOptions())
    cache = PoolCache()  # one process: the assume step does not cover scalars, so every race is real

    async def one(i: int) -> str:
        start = base + timedelta(minutes=10 * rng.randrange(12))
        body = ReservationRequest.model_validate(
            {
                "tenantId": "capped" if i % 2 else f"free-{i}",
                "poolId": pool,
                "resources": {"cpu": rng.choice([2, 3, 4])},
                "start": start.isoformat(),
                "duration": 60 * 10 * rng.randint(1, 6),
                "idempotencyKey": f"race-{i}",
            }
        )
        try:
            view, _ = await create_reservation(engine, cache, config, body)
        except QuotaExceeded:
            return "quota"
        if view.status == "placed" and i % 5 == 0:  # some are released while others still race
            await release_reservation(engine, view.id, None, now=start + timedelta(minutes=5))
            return "released"
        return str(view.status)

    outcomes = await asyncio.gather(*(one(i) for i in range(CLIENTS)))
    assert "placed" in outcomes and "pending" in outcomes, outcomes  # contention was real
    async with engine.connect() as conn:
        for name in SWEEPS:
            rows = (await conn.exec_driver_sql(CHECKS[name])).all()
            assert rows == [], (name, rows, outcomes)
        # every placed reservation holds its cpu over its whole window
        held = (
            await conn.exec_driver_sql(
                "SELECT count(*) FROM reservations r JOIN allocations a ON a.reservation_id = r.id "
                "JOIN scalar_holdings h ON h.allocation_id = a.id "
                "WHERE r.status = 'placed' AND h.starts_at = lower(a.during) AND h.ends_at = upper(a.during)"
            )
        ).scalar_one()
    assert held == outcomes.count("placed")
