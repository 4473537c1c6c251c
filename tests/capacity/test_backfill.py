"""Planned starts (issue 24, Done when 2; docs/lifecycle.md, "Planned starts") on real PostgreSQL, time
driven with ``now`` passed to the planner and the sweeps: the head of a pool's queue gets a planned window
that later work cannot overlap, is placed when it comes, and small work that ends before it still
backfills; a release, a deadline and a broken atom drop a plan; spot work never gets one."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.answers.reservations import Preview, Reservation
from app.capacity.config import CapacityConfig
from app.capacity.controllers.backfill import NO_PLAN, PLACED_NOW, PLANNED, plan_pool, start_planned
from app.capacity.controllers.lifecycle import end_passed_deadlines
from app.capacity.controllers.repair import drop_broken_plans
from app.capacity.controllers.wake import wake_pool
from app.capacity.planning.snapshot import PoolCache
from app.capacity.reservations.create import create_reservation
from app.capacity.reservations.preview import preview
from app.capacity.reservations.release import release_reservation
from app.capacity.views import read_view
from app.db.tables import allocations, devices
from app.placement.options import SchedulerOptions
from app.placement.request import ReservationRequest
from tests.capacity.helpers import db_time, make_pool_with_nodes, overlapping_bookings
from tests.capacity.invariants import violations
from tests.factories import node_body, reservation

CONFIG = CapacityConfig(SchedulerOptions())


async def _create(
    engine: AsyncEngine, cache: PoolCache, pool: str, gpus: int, duration: str, **extra: Any
) -> Reservation:
    body = ReservationRequest.model_validate(reservation(pool, gpus, duration=duration, **extra))
    view, _ = await create_reservation(engine, cache, CONFIG, body)
    return view


async def _view(engine: AsyncEngine, reservation_id: str) -> Reservation:
    async with engine.connect() as conn:
        view = await read_view(conn, reservation_id)
    assert view is not None
    return view


async def _planned_allocations(engine: AsyncEngine, reservation_id: str) -> int:
    async with engine.connect() as conn:
        stmt = sa.select(sa.func.count()).where(
            allocations.c.reservation_id == reservation_id, allocations.c.planned
        )
        return (await conn.execute(stmt)).scalar_one()


async def _head_behind_an_hour(engine: AsyncEngine, **extra: Any) -> tuple[str, str, datetime, Reservation]:
    """An 8-GPU node with 4 GPUs held by another tenant for the next hour, and an 8-GPU x 1 h request
    pending behind them; returns (pool, node id, the holding's end, the pending view)."""
    cache = PoolCache()
    pool, [node] = await make_pool_with_nodes(engine, [node_body("bf", 8)])
    held = await _create(engine, cache, pool, 4, "1h", tenant="other")
    assert held.status == "placed"
    head = await _create(engine, cache, pool, 8, "1h", **extra)
    assert head.status == "pending"
    return pool, node.id, datetime.fromisoformat(held.allocations[0].end), head


async def test_the_head_is_placed_at_the_end_of_the_hour_and_only_short_work_backfills(
    clean_db: AsyncEngine,
) -> None:
    engine, cache = clean_db, PoolCache()
    pool, node_id, hour_end, head = await _head_behind_an_hour(engine)

    [planned] = await plan_pool(engine, cache, CONFIG, pool)
    assert (planned.reservation_id, planned.result, planned.start) == (head.id, PLANNED, hour_end)
    view = await _view(engine, head.id)
    assert view.status == "pending" and view.allocations == []  # a planned window is not listed
    assert view.plannedStart is not None and datetime.fromisoformat(view.plannedStart) == hour_end
    [condition] = [c for c in view.conditions if c.type == "Planned"]
    assert condition.reason == "PlannedStart" and condition.nodeId == node_id
    assert condition.at is not None and datetime.fromisoformat(condition.at) == hour_end

    # a stream of 4 GPUs x 2 h: 4 GPUs are free now, but each would overlap the planned window: it waits
    stream = [await _create(engine, cache, pool, 4, "2h") for _ in range(40)]
    assert {s.status for s in stream} == {"pending"}
    # 4 GPUs x 30 min end before the planned start: placed now (backfill)
    short = await _create(engine, cache, pool, 4, "30m")
    assert short.status == "placed"
    assert datetime.fromisoformat(short.allocations[0].end) < hour_end

    # edges: the wake places nothing of the stream (and the head does not fit now, its plan kept), then
    # the planner's pass keeps the head's window and plans the stream after it, never on it
    woken = await wake_pool(engine, cache, CONFIG, pool)
    assert {w.result for w in woken} == {"pending"}
    plans = await plan_pool(engine, cache, CONFIG, pool)
    assert len(plans) == CONFIG.backfill_depth
    assert (plans[0].reservation_id, plans[0].result, plans[0].start) == (head.id, PLANNED, hour_end)
    later = [p for p in plans[1:] if p.result == PLANNED]
    assert later and all(p.start is not None and p.start >= hour_end + timedelta(hours=1) for p in later)
    assert await _planned_allocations(engine, head.id) == 1

    # nothing is due before the planned start; at it, the head is placed for [end of hour, + 1 h)
    assert await start_planned(engine, CONFIG, now=hour_end - timedelta(seconds=1)) == []
    [started] = await start_planned(engine, CONFIG, now=hour_end)
    assert (started.reservation_id, started.result) == (head.id, PLACED_NOW)
    placed = await _view(engine, head.id)
    assert placed.status == "placed" and placed.plannedStart is None
    [allocation] = placed.allocations
    assert len(allocation.atoms) == 8 and allocation.nodeId == node_id
    assert datetime.fromisoformat(allocation.start) == hour_end
    assert datetime.fromisoformat(allocation.end) == hour_end + timedelta(hours=1)
    assert [c.type for c in placed.conditions if c.type in ("Planned", "Scheduled")] == ["Scheduled"]
    assert [c.status for c in placed.conditions if c.type == "Unschedulable"] == ["False"]
    assert {(await _view(engine, s.id)).status for s in stream} == {"pending"}

    async with engine.connect() as conn:
        assert await overlapping_bookings(conn) == 0
    assert await violations(engine) == {}


async def test_preview_says_when_planned_windows_are_why_it_does_not_fit(clean_db: AsyncEngine) -> None:
    engine, cache = clean_db, PoolCache()
    pool, _, hour_end, head = await _head_behind_an_hour(engine)
    await plan_pool(engine, cache, CONFIG, pool)

    async def _preview(gpus: int, duration: str) -> Preview:
        body = ReservationRequest.model_validate(reservation(pool, gpus, duration=duration))
        return await preview(engine, cache, CONFIG, body)

    # 4 free GPUs for 2 h: free now, but the head's planned window takes them at the end of the hour
    blocked = await _preview(4, "2h")
    assert blocked.fits is False and blocked.reason is not None
    summary, note = blocked.reason.rsplit("; ", 1)
    assert summary.startswith("no node fits (1 node): 1 × fits: 0 of 8 gpu free")
    assert note == "planned windows of 1 pending reservation hold what it needs"
    assert blocked.earliest is not None and datetime.fromisoformat(blocked.earliest.start) > hour_end
    # 8 GPUs for 2 h do not fit without the plan either (4 are booked now): no note
    full = await _preview(8, "2h")
    assert full.fits is False and full.reason is not None and "planned windows" not in full.reason
    # 4 GPUs for 30 min end before the planned start: they fit
    assert (await _preview(4, "30m")).fits is True
    # once the head's plan goes (released), nothing planned is in the way
    await release_reservation(engine, head.id, None)
    after = await _preview(4, "2h")
    assert after.fits is True


async def test_a_planned_head_that_fits_now_is_placed_by_the_pass(clean_db: AsyncEngine) -> None:
    engine, cache = clean_db, PoolCache()
    pool, _, _, head = await _head_behind_an_hour(engine)
    await plan_pool(engine, cache, CONFIG, pool)
    async with engine.connect() as conn:
        held = (
            await conn.execute(
                sa.select(allocations.c.reservation_id).where(
                    allocations.c.pool_id == pool, allocations.c.reservation_id != head.id
                )
            )
        ).scalar_one()
    await release_reservation(engine, held, None)  # capacity frees early: the plan moves to now
    [planning] = await plan_pool(engine, cache, CONFIG, pool)
    assert (planning.reservation_id, planning.result) == (head.id, PLACED_NOW)
    view = await _view(engine, head.id)
    assert view.status == "placed" and view.plannedStart is None and len(view.allocations[0].atoms) == 8
    assert await violations(engine) == {}


async def test_a_release_of_a_planned_reservation_frees_its_window(clean_db: AsyncEngine) -> None:
    engine, cache = clean_db, PoolCache()
    pool, _, hour_end, head = await _head_behind_an_hour(engine)
    await plan_pool(engine, cache, CONFIG, pool)
    assert (await _create(engine, cache, pool, 4, "2h")).status == "pending"  # it would overlap the plan

    released = await release_reservation(engine, head.id, None)
    assert released.status == "released" and released.plannedStart is None
    assert [c.type for c in released.conditions if c.type == "Planned"] == []
    assert await _planned_allocations(engine, head.id) == 0
    after = await _create(engine, cache, pool, 4, "2h")  # the window is free again
    assert after.status == "placed" and datetime.fromisoformat(after.allocations[0].end) > hour_end
    assert await violations(engine) == {}


async def test_a_planned_window_never_starts_at_or_after_the_deadline(clean_db: AsyncEngine) -> None:
    engine, cache = clean_db, PoolCache()
    now = await db_time(engine)
    early = (now + timedelta(minutes=59)).isoformat()  # before the end of the hour: no window for it
    pool, _, hour_end, first = await _head_behind_an_hour(engine, deadline=early)
    late = hour_end + timedelta(minutes=10)
    second = await _create(engine, cache, pool, 8, "1h", deadline=late.isoformat())

    plans = await plan_pool(engine, cache, CONFIG, pool)
    assert [(p.reservation_id, p.result, p.start) for p in plans] == [
        (first.id, NO_PLAN, None),
        (second.id, PLANNED, hour_end),
    ]
    assert (await _view(engine, first.id)).plannedStart is None

    # the deadline sweep ends a planned reservation and drops its window with it
    assert await end_passed_deadlines(engine, now=late) == [first.id, second.id]
    ended = await _view(engine, second.id)
    assert ended.status == "ended" and ended.plannedStart is None
    assert await _planned_allocations(engine, second.id) == 0
    assert await violations(engine) == {}


async def test_spot_work_never_gets_a_plan(clean_db: AsyncEngine) -> None:
    engine, cache = clean_db, PoolCache()
    pool, _, _, spot = await _head_behind_an_hour(engine, spot=True)
    assert await plan_pool(engine, cache, CONFIG, pool) == []
    view = await _view(engine, spot.id)
    assert view.status == "pending" and view.plannedStart is None
    assert await _planned_allocations(engine, spot.id) == 0


async def test_a_plan_on_a_broken_atom_is_dropped_and_planned_again(clean_db: AsyncEngine) -> None:
    engine, cache = clean_db, PoolCache()
    pool, _, _, head = await _head_behind_an_hour(engine)
    await plan_pool(engine, cache, CONFIG, pool)
    async with engine.begin() as conn:
        [atoms] = (
            await conn.execute(sa.select(allocations.c.atoms).where(allocations.c.reservation_id == head.id))
        ).scalars()
        atom = atoms[0]
        await conn.execute(sa.update(devices).where(devices.c.id == atom).values(healthy=False))
    assert await drop_broken_plans(engine) == [head.id]
    assert await _planned_allocations(engine, head.id) == 0
    assert (await _view(engine, head.id)).plannedStart is None
    # 7 healthy GPUs are left: no window for 8 within the lead, so no plan
    [planning] = await plan_pool(engine, cache, CONFIG, pool)
    assert planning.result == NO_PLAN
    assert await violations(engine, skip=["in use on an unavailable atom"]) == {}
