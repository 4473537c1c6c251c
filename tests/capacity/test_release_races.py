"""A release racing BookingRepair for the reservation row (tests/capacity/test_stress.py once found a
released reservation whose old allocation was booked past its ``released_at``).

The release's transaction begins, then waits for the row that a repair (begun later) claimed; the repair
cuts the old allocation at its own clock reading, moves the booking to the node's other GPU and commits;
then the release gets the row and cuts what is live. Its instant must come after the repair's: with the
transaction's ``now()`` (its BEGIN, before the wait) it came before it, and the old allocation's booking
outlived the release.

``release_reservation`` (app/capacity/reservations/release.py) reads its instant after the row lock with
``SELECT statement_timestamp()``, not ``now()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.capacity.config import CapacityConfig
from app.capacity.controllers.repair import SAME_NODE, repair_reservation
from app.capacity.planning.snapshot import PoolCache
from app.capacity.reservations.create import create_reservation
from app.capacity.reservations.release import release_reservation
from app.db.tables import pools
from app.inventory import service as inventory
from app.inventory.schemas import HealthBody
from app.placement.options import SchedulerOptions
from app.placement.request import ReservationRequest
from tests.capacity.helpers import make_pool_with_nodes
from tests.capacity.invariants import CHECKS
from tests.factories import node_body

STILL_HOLDING = "released, ended or preempted reservation still holding"


class _BegunEarly:
    """The engine as the release sees it, its one transaction begun already on ``conn``: the gap between
    a transaction's BEGIN and its first row lock, which a loaded server stretches, made certain."""

    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncConnection]:
        yield self.conn


async def _waiting_for_a_lock(engine: AsyncEngine, backends: int) -> None:
    """Until ``backends`` sessions of this database wait for a lock (``pg_locks``, not granted)."""
    sql = (
        "SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE NOT l.granted AND a.datname = current_database()"
    )
    for _ in range(500):
        async with engine.connect() as conn:
            if (await conn.exec_driver_sql(sql)).scalar_one() >= backends:
                return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{backends} sessions never waited for a lock")


async def test_a_release_that_waited_for_a_repair_cuts_after_it(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, [node] = await make_pool_with_nodes(engine, [node_body("n0", 2, cpu=16)])
    cache, config = PoolCache(), CapacityConfig(SchedulerOptions())
    body = ReservationRequest.model_validate(
        {
            "tenantId": "acme",
            "poolId": pool,
            "devices": [{"class": "gpu", "count": 1}],
            "duration": "1d",
            "idempotencyKey": "release-vs-repair",
        }
    )
    view, _ = await create_reservation(engine, cache, config, body)
    [alloc] = view.allocations
    async with engine.begin() as conn:
        health = HealthBody.model_validate({"devices": [{"id": alloc.atoms[0], "healthy": False}]})
        await inventory.set_health(conn, node.id, health)

    async with engine.connect() as release_conn, engine.connect() as blocker:
        await release_conn.exec_driver_sql("SELECT 1")  # the release's transaction begins: its now()
        # the pool row held FOR NO KEY UPDATE: the repair stops at its cut's FOR SHARE, the row claimed
        await blocker.execute(sa.select(pools.c.id).where(pools.c.id == pool).with_for_update(key_share=True))
        repair = asyncio.create_task(repair_reservation(engine, cache, config, view.id))
        await _waiting_for_a_lock(engine, 1)
        release = asyncio.create_task(release_reservation(_BegunEarly(release_conn), view.id, None))
        await _waiting_for_a_lock(engine, 2)  # the release waits for the repair's row lock
        await blocker.rollback()
        [repaired] = await repair
        released = await release
        await release_conn.commit()

    assert repaired.result == SAME_NODE and repaired.old_atoms != repaired.new_atoms
    assert released.status == "released"
    async with engine.connect() as conn:
        rows = (await conn.exec_driver_sql(CHECKS[STILL_HOLDING])).all()
        bookings = (
            await conn.execute(
                sa.text(
                    "SELECT count(*) FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id "
                    "WHERE a.reservation_id = :rid AND upper(b.during) > now()"
                ),
                {"rid": view.id},
            )
        ).scalar_one()
    assert rows == [], rows
    assert bookings == 0
