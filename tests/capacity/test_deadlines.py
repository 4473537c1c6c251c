"""Deadlines (issue 24, Done when 4; docs/lifecycle.md, "Deadlines"): a reservation still pending or
queued at its deadline is ended with ``Ended`` / ``DeadlinePassed`` by the lifecycle sweep (``now``
passed in); a wake, the queue worker and a wake after BookingRepair's move to pending never place one
whose window would start at or after its deadline; sweeps racing on two engines end each reservation
exactly once, and skip a row another transaction holds."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.config import CapacityConfig
from app.capacity.controllers.lifecycle import end_passed_deadlines
from app.capacity.controllers.repair import TO_PENDING, repair_reservation
from app.capacity.controllers.wake import PLACED, STILL_PENDING, wake_pool
from app.capacity.planning.snapshot import PoolCache
from app.capacity.queue.intake import insert_reservations
from app.capacity.queue.worker import DEADLINE_PASSED_WHILE_QUEUED, work_batch
from app.capacity.queue.worker import create as enqueue
from app.capacity.reservations.create import create_reservation
from app.db.engine import create_engine
from app.db.tables import devices, reservations
from app.inventory import service as inventory
from app.placement.options import SchedulerOptions
from app.placement.request import ReservationRequest
from tests.capacity.helpers import db_time, make_pool_with_nodes
from tests.factories import make_pool, node_body, reservation

GIVE_UP = 30.0  # seconds: a bound on waiting for the database clock, never a measured figure
CONFIG = CapacityConfig(SchedulerOptions())


def _body(pool: str, key: str, gpus: int = 1, **extra: Any) -> ReservationRequest:
    return ReservationRequest.model_validate(reservation(pool, gpus, key=key, duration="1h", **extra))


async def _row(engine: AsyncEngine, reservation_id: str) -> Any:
    async with engine.connect() as conn:
        return (await conn.execute(sa.select(reservations).where(reservations.c.id == reservation_id))).one()


async def _past(engine: AsyncEngine, instant: datetime) -> None:
    """Wait until the database clock is past ``instant``."""
    given_up = time.monotonic() + GIVE_UP
    while await db_time(engine) <= instant:
        assert time.monotonic() < given_up, f"the database clock did not pass {instant}"
        await asyncio.sleep(0.05)


def _reasons(conditions: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(c["type"], c["reason"]) for c in conditions]


async def test_a_pending_reservation_at_its_deadline_ends(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)  # no nodes: everything stays pending
    deadline = (await db_time(engine)) + timedelta(minutes=10)
    body = reservation(pool, 1, deadline=deadline.isoformat())
    bounded = (await admin_client.post("/v1/reservations", json=body)).json()
    waiting = (await admin_client.post("/v1/reservations", json=reservation(pool, 1))).json()
    assert bounded["status"] == waiting["status"] == "pending"
    assert datetime.fromisoformat(bounded["spec"]["deadline"]) == deadline  # the answers show it
    assert waiting["spec"]["deadline"] is None

    assert await end_passed_deadlines(engine, now=deadline - timedelta(microseconds=1)) == []  # not yet
    assert await end_passed_deadlines(engine, now=deadline) == [bounded["id"]]  # at it: ended
    assert await end_passed_deadlines(engine, now=deadline + timedelta(hours=1)) == []  # once only

    ended = (await admin_client.get(f"/v1/reservations/{bounded['id']}")).json()
    assert ended["status"] == "ended" and ended["allocations"] == []
    assert datetime.fromisoformat(ended["spec"]["deadline"]) == deadline
    assert ended["conditions"][-1] == {
        "type": "Ended",
        "status": "True",
        "reason": "DeadlinePassed",
        "message": f"the deadline {deadline.isoformat()} passed while the reservation was pending",
    }
    listed = (await admin_client.get("/v1/reservations", params={"status": "ended"})).json()["items"]
    assert [datetime.fromisoformat(r["spec"]["deadline"]) for r in listed] == [deadline]
    # without a deadline it waits
    assert (await admin_client.get(f"/v1/reservations/{waiting['id']}")).json()["status"] == "pending"
    quota = (await admin_client.get(f"/v1/tenants/acme/quotas/{pool}")).json()
    assert quota["used"].get("gpu", 0) == 0  # nothing was held, nothing refunded


async def test_a_queued_reservation_at_its_deadline_ends_and_a_placed_one_is_left(
    clean_db: AsyncEngine,
) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body("dl-q", 1)])
    deadline = (await db_time(engine)) + timedelta(minutes=10)
    async with engine.begin() as conn:
        [queued] = await insert_reservations(
            conn, [_body(pool, "q", deadline=deadline.isoformat())], "queued"
        )
    placed, _ = await create_reservation(engine, PoolCache(), CONFIG, _body(pool, "p", deadline=deadline))
    assert placed.status == "placed" and placed.spec.deadline is not None

    assert await end_passed_deadlines(engine, now=deadline) == [queued.row.id]
    row = await _row(engine, queued.row.id)
    assert row.status == "ended" and row.deadline == deadline
    assert row.conditions[-1]["message"].endswith("passed while the reservation was queued")
    assert (await _row(engine, placed.id)).status == "placed"  # a deadline binds only what waits


async def test_a_wake_after_the_deadline_does_not_place_it(clean_db: AsyncEngine) -> None:
    engine = clean_db
    async with engine.begin() as conn:
        pool = (await inventory.create_pool(conn, "deadline-wake")).id  # no nodes yet
    cache = PoolCache()
    soon = (await db_time(engine)) + timedelta(seconds=1.5)
    later = soon + timedelta(hours=1)
    late, _ = await create_reservation(engine, cache, CONFIG, _body(pool, "late", deadline=soon))
    free, _ = await create_reservation(engine, cache, CONFIG, _body(pool, "free"))
    bounded, _ = await create_reservation(engine, cache, CONFIG, _body(pool, "bounded", deadline=later))
    assert late.status == free.status == bounded.status == "pending"
    await _past(engine, soon)
    async with engine.begin() as conn:  # room for all three now
        await inventory.add_node(conn, pool, node_body("dl-wake", 3))

    woken = await wake_pool(engine, cache, CONFIG, pool)

    assert [(w.reservation_id, w.result) for w in woken] == [
        (late.id, STILL_PENDING),  # oldest first, and too late: not placed though it fits
        (free.id, PLACED),
        (bounded.id, PLACED),  # its deadline is still ahead
    ]
    row = await _row(engine, late.id)
    assert row.status == "pending" and "Scheduled" not in [c["type"] for c in row.conditions]
    assert await end_passed_deadlines(engine) == [late.id]  # the database clock: the sweep ends it


async def test_the_queue_worker_does_not_place_a_reservation_past_its_deadline(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body("dl-worker", 2)])
    cache = PoolCache()
    lease = CapacityConfig(SchedulerOptions(), placer="pool-lease")
    soon = (await db_time(engine)) + timedelta(seconds=1.5)
    late, _ = await enqueue(engine, cache, lease, _body(pool, "late", deadline=soon))
    free, _ = await enqueue(engine, cache, lease, _body(pool, "free"))
    assert late.status == free.status == "queued"
    await _past(engine, soon)

    assert await work_batch(engine, cache, lease, pool) == 2

    row = await _row(engine, late.id)
    assert row.status == "pending" and row.conditions[-1]["message"] == DEADLINE_PASSED_WHILE_QUEUED
    assert (await _row(engine, free.id)).status == "placed"
    assert await end_passed_deadlines(engine) == [late.id]
    assert _reasons((await _row(engine, late.id)).conditions)[-1] == ("Ended", "DeadlinePassed")


async def test_a_reservation_repaired_to_pending_after_its_deadline_is_not_placed_again(
    clean_db: AsyncEngine,
) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body("dl-repair", 1)])
    cache = PoolCache()
    soon = (await db_time(engine)) + timedelta(seconds=1.5)
    placed, _ = await create_reservation(engine, cache, CONFIG, _body(pool, "r", deadline=soon))
    assert placed.status == "placed"  # placed before its deadline: a deadline binds only what waits
    [atom] = placed.allocations[0].atoms
    await _past(engine, soon)
    async with engine.begin() as conn:
        await conn.execute(sa.update(devices).where(devices.c.id == atom).values(healthy=False))

    [repair] = await repair_reservation(engine, cache, CONFIG, placed.id)
    assert repair.result == TO_PENDING  # the only atom broke: nothing else fits
    async with engine.begin() as conn:  # health back: it would fit again
        await conn.execute(sa.update(devices).where(devices.c.id == atom).values(healthy=True))
    [woken] = await wake_pool(engine, cache, CONFIG, pool)

    assert woken.result == STILL_PENDING
    assert await end_passed_deadlines(engine) == [placed.id]
    assert _reasons((await _row(engine, placed.id)).conditions) == [
        ("Repaired", "AtomUnavailable"),
        ("Unschedulable", "NoFit"),
        ("Ended", "DeadlinePassed"),
    ]


async def test_two_engines_sweeping_at_once_end_each_reservation_once(
    clean_db: AsyncEngine, database_url: str
) -> None:
    engine = clean_db
    async with engine.begin() as conn:
        pool = (await inventory.create_pool(conn, "deadline-race")).id
    base = (await db_time(engine)) + timedelta(minutes=10)
    bodies = [_body(pool, f"race-{i}", deadline=base + timedelta(seconds=i % 7)) for i in range(60)]
    async with engine.begin() as conn:
        ids = [w.row.id for w in await insert_reservations(conn, bodies)]
    now = base + timedelta(minutes=1)
    other = create_engine(database_url, pool_size=4)  # a second replica's connections

    async def sweep(on: AsyncEngine) -> list[str]:
        ended: list[str] = []
        while batch := await end_passed_deadlines(on, now=now, limit=4):
            ended += batch
        return ended

    try:
        runs = await asyncio.gather(sweep(engine), sweep(other), sweep(engine), sweep(other))
    finally:
        await other.dispose()
    ended = [i for run in runs for i in run]
    assert sorted(ended) == sorted(ids)  # each once: none twice, none left
    async with engine.connect() as conn:
        rows = (await conn.execute(sa.select(reservations).where(reservations.c.pool_id == pool))).all()
    for row in rows:
        assert row.status == "ended"
        assert _reasons(row.conditions) == [("Ended", "DeadlinePassed")], row.id  # ended once


async def test_a_sweep_skips_a_row_held_by_a_wake_and_never_ends_what_it_placed(
    clean_db: AsyncEngine,
) -> None:
    engine = clean_db
    async with engine.begin() as conn:
        pool = (await inventory.create_pool(conn, "deadline-held")).id
    deadline = (await db_time(engine)) + timedelta(minutes=10)
    bodies = [_body(pool, key, deadline=deadline) for key in ("held", "free")]
    async with engine.begin() as conn:
        held, free = (w.row.id for w in await insert_reservations(conn, bodies))
    async with engine.connect() as holder:  # as a wake placing it holds its row
        await holder.execute(sa.select(reservations).where(reservations.c.id == held).with_for_update())
        assert await end_passed_deadlines(engine, now=deadline) == [free]  # skipped, never waited for
        await holder.execute(sa.update(reservations).where(reservations.c.id == held).values(status="placed"))
        await holder.commit()
    assert await end_passed_deadlines(engine, now=deadline) == []  # status re-checked: placed stays
    assert (await _row(engine, held)).status == "placed"
