"""Planned starts: backfill that protects the head of the queue (docs/lifecycle.md, "Planned starts").

A pending reservation waits for a wake edge and is placed only when it fits at that moment, so without a
plan a large request loses every free moment to the smaller ones behind it. The planner gives the
pool's oldest pending reservations (no explicit ``start``, not spot; at most ``BC_CAPACITY_BACKFILL_DEPTH``)
a **planned window**: the earliest window at which each fits
(:func:`app.capacity.planning.earliest.find_earliest`) around the planned windows of the older ones.
A planned window is a real allocation at that window, committed by the guarded commit and flagged
``planned`` (:mod:`app.capacity.commit.plans`): the bookings' exclusion constraint and the scalar guards
refuse any later create, bulk item, wake, repair or preemption that would overlap it on its atoms or
scalars, while work that ends before its start still fits (backfill). It holds no quota.

:func:`plan_pool` is one planner pass over a pool, run after each wake of the pool
(:meth:`app.capacity.controllers.wake.WakeController.run`), in one transaction:

1. the pool's planner lock (a transaction-scoped advisory try-lock, :data:`PLANNER_LOCK`): one replica
   plans a pool at a time, and a replica that finds it taken skips the pass (the holder is planning
   with what is committed);
2. the oldest pending reservations that may be planned, claimed ``FOR UPDATE SKIP LOCKED`` (a row that
   a wake, a release or a sweep holds is left to it);
3. all their current plans are dropped at once, so that an older one may move earlier into room a
   younger one's plan held; then, oldest first, each searches its earliest window from now: at now it
   is placed for real (charged, ``Scheduled`` with its wait); later it is committed as its plan
   (``plannedStart``, condition ``Planned``); no window within the lead, or one at or after its
   deadline, leaves it without a plan.

Nothing in the pass waits for a lock the others hold first: the advisory lock and the row claims are
try-locks, and the commits take pools -> nodes -> devices -> node_resources (-> quota_usage) as every
placement (docs/architecture.md, "Lock order"). Others see the pass when it commits: until then they
still see the old plans, so a window dropped and taken again is never free to anyone in between.

:func:`start_planned` (a lifecycle task) turns a plan into a placement when its start comes: the
allocation is no longer planned, the quota is charged for the window, and the reservation is
``placed`` with ``Scheduled``; a refused charge drops the plan and leaves it pending (``QuotaExceeded``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.capacity.commit.plans import drop_plans, mark_planned, start_plan
from app.capacity.commit.shapes import NO_EXTRAS, CommitExtras, QuotaCharge
from app.capacity.conditions import (
    QUOTA_EXCEEDED,
    appended,
    from_stored,
    planned_condition,
    stored,
    with_unschedulable,
    without_planned,
)
from app.capacity.config import END_BATCH, CapacityConfig
from app.capacity.controllers.wake import placed_conditions
from app.capacity.edges import notify_pool
from app.capacity.placing.inline import Placed, db_now, place_inline
from app.capacity.planning.earliest import NoWindow, find_earliest
from app.capacity.planning.snapshot import PoolCache
from app.capacity.requests import placement_request, quota_amounts
from app.db.tables import allocations, nodes, reservations
from app.errors import QuotaExceeded
from app.placement.request import EARLIEST, ReservationRequest, deadline_passed
from app.quota.charges import charge

PLANNER_LOCK = 150_013  # the advisory lock class of the planner's pass per pool (the key: hashtext(pool id))

PLANNED, PLACED_NOW, NO_PLAN, QUOTA_REFUSED = "planned", "placed", "none", "quota_exceeded"
START_PLANNED = "start-planned"  # the lifecycle task of :func:`start_all_planned`


@dataclass(frozen=True, slots=True)
class Planning:
    """What a planner pass did with one pending reservation: ``result`` planned / placed / none /
    quota_exceeded, and the window's start when planned or placed."""

    reservation_id: str
    result: str
    start: datetime | None = None


def planner_lock(pool_id: str) -> Any:
    """``pg_try_advisory_xact_lock(PLANNER_LOCK, hashtext(:pool_id))``: the pool's planner pass, held to
    the end of the transaction; false when another transaction holds it (never waits)."""
    return sa.func.pg_try_advisory_xact_lock(sa.literal_column(str(PLANNER_LOCK)), sa.func.hashtext(pool_id))


# a reservation the planner may plan: no explicit start ("earliest" waits like one without), not spot
PLANNABLE = (
    reservations.c.status == "pending",
    sa.or_(reservations.c.spec["start"].astext.is_(None), reservations.c.spec["start"].astext == EARLIEST),
    sa.func.coalesce(reservations.c.spec["spot"].astext.cast(sa.Boolean), False).is_(False),
)


async def plan_pool(
    engine: AsyncEngine, cache: PoolCache, config: CapacityConfig, pool_id: str, now: datetime | None = None
) -> list[Planning] | None:
    """One planner pass over ``pool_id`` at ``now`` (default: the database clock), as the module
    docstring says; returns what it did with each reservation it claimed, oldest first (nothing when
    ``config.backfill_depth`` is 0), or None when another transaction holds the pool's planner lock (its
    pass may predate the caller's edge: the wake controller runs the pool again later)."""
    if config.backfill_depth <= 0:
        return []
    assumptions: list[int] = []
    done: list[Planning] = []
    try:
        async with engine.begin() as conn:
            if not (await conn.execute(sa.select(planner_lock(pool_id)))).scalar():
                return None
            at = now if now is not None else await db_now(conn)
            # SELECT * FROM reservations
            #  WHERE pool_id = :pool AND status = 'pending'
            #    AND (spec->>'start' IS NULL OR spec->>'start' = 'earliest')
            #    AND coalesce((spec->>'spot')::boolean, false) IS false
            #  ORDER BY created_at, id LIMIT :depth FOR UPDATE SKIP LOCKED
            rows = (
                await conn.execute(
                    sa.select(reservations)
                    .where(reservations.c.pool_id == pool_id, *PLANNABLE)
                    .order_by(reservations.c.created_at, reservations.c.id)
                    .limit(config.backfill_depth)
                    .with_for_update(skip_locked=True)
                )
            ).all()
            if not rows:
                return []
            await drop_plans(conn, [r.id for r in rows])  # all at once: an older one may move earlier
            for row in rows:
                done.append(await _plan_one(conn, cache, config, row, at, assumptions))
            if any(
                r.planned_start is not None and d.result == NO_PLAN for r, d in zip(rows, done, strict=True)
            ):
                await notify_pool(conn, pool_id)  # wake edge: a plan was dropped and not made again
    finally:  # committed or rolled back: the bookings (or their absence) are visible to every plan
        for token in assumptions:
            cache.forget(pool_id, token)
    return done


async def _plan_one(
    conn: AsyncConnection,
    cache: PoolCache,
    config: CapacityConfig,
    row: Any,
    now: datetime,
    assumptions: list[int],
) -> Planning:
    """Plan one claimed reservation (its old plan already dropped) in ``conn``'s transaction."""
    body = ReservationRequest.model_validate({**row.spec, "idempotencyKey": row.idempotency_key})
    request = placement_request(config, body, now)
    attempt = await conn.begin_nested()  # SAVEPOINT: a lost race or a refused charge leaves nothing
    try:
        found = await find_earliest(conn, cache, config, request, now)
        if isinstance(found, NoWindow):
            await attempt.commit()
            return await _unplanned(conn, row)
        moved = found.request
        assert moved.start is not None and moved.end is not None
        if deadline_passed(row.deadline, moved.start):
            await attempt.commit()
            return await _unplanned(conn, row)  # a planned window never starts at or after the deadline
        now_or_later = moved.start <= now
        extras = NO_EXTRAS
        if now_or_later:  # it fits now: placed for real, charged with the commit (a wake's placement)
            amounts = quota_amounts(moved)
            extras = CommitExtras(
                QuotaCharge(row.tenant_id, row.pool_id, row.id, amounts, moved.start, moved.end)
            )
        outcome = await place_inline(
            conn, cache, moved, row.id, config.options, 1, config.shortlist_min, extras=extras
        )
    except QuotaExceeded:
        await attempt.rollback()
        await _unplanned(conn, row)
        return Planning(row.id, QUOTA_REFUSED)
    if not isinstance(outcome, Placed):  # someone committed there since the search: the next pass
        await attempt.rollback()
        return await _unplanned(conn, row)
    await attempt.commit()
    assumptions.extend(outcome.assumptions)
    if now_or_later:
        waited = max((now - row.created_at).total_seconds(), 0.0)
        await _update(
            conn,
            row.id,
            status="placed",
            ends_at=moved.end,
            planned_start=None,
            conditions=placed_conditions(without_planned(row.conditions), now, waited),
        )
        return Planning(row.id, PLACED_NOW, moved.start)
    await mark_planned(conn, [a.allocation_id for a in outcome.allocations])
    first = outcome.allocations[0]
    name = (await conn.execute(sa.select(nodes.c.name).where(nodes.c.id == first.node_id))).scalar_one()
    planned = planned_condition(moved.start, moved.end, first.node_id, name)
    await _update(
        conn, row.id, planned_start=moved.start, conditions=appended(without_planned(row.conditions), planned)
    )
    return Planning(row.id, PLANNED, moved.start)


async def _unplanned(conn: AsyncConnection, row: Any) -> Planning:
    """The reservation keeps no plan: clear ``planned_start`` and its ``Planned`` condition."""
    if row.planned_start is not None:
        await _update(conn, row.id, planned_start=None, conditions=without_planned(row.conditions))
    return Planning(row.id, NO_PLAN)


async def _update(conn: AsyncConnection, reservation_id: str, **values: Any) -> None:
    await conn.execute(
        sa.update(reservations)
        .where(reservations.c.id == reservation_id)
        .values(**values, updated_at=sa.func.now())
    )


async def start_planned(
    engine: AsyncEngine, config: CapacityConfig, now: datetime | None = None, limit: int = END_BATCH
) -> list[Planning]:
    """Place the pending reservations whose planned start is at or before ``now`` (default: the database
    clock), earliest first, in one transaction: the planned allocation becomes the placement (its
    bookings stay), the quota is charged over its window, the reservation is ``placed`` with
    ``Scheduled`` naming its wait. A refused charge drops the plan (a wake edge) and leaves it pending
    with ``Unschedulable`` / ``QuotaExceeded``. Replica-safe: the rows are claimed ``FOR UPDATE SKIP
    LOCKED`` through ``ix_reservations_planned_start`` and ``status = 'pending'`` is re-checked on a
    locked row, so each plan is started once. Returns what it did, ``placed`` or ``quota_exceeded``."""
    done: list[Planning] = []
    async with engine.begin() as conn:
        at = now if now is not None else await db_now(conn)
        # SELECT * FROM reservations WHERE status = 'pending' AND planned_start <= :now
        #  ORDER BY planned_start LIMIT :limit FOR UPDATE SKIP LOCKED      -- ix_reservations_planned_start
        due = (
            await conn.execute(
                sa.select(reservations)
                .where(reservations.c.status == "pending", reservations.c.planned_start <= at)
                .order_by(reservations.c.planned_start)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
        ).all()
        for row in due:
            done.append(await _start_one(conn, config, row, at))
    return done


async def _start_one(conn: AsyncConnection, config: CapacityConfig, row: Any, now: datetime) -> Planning:
    # SELECT min(lower(during)), max(upper(during)) FROM allocations WHERE reservation_id = :id AND planned
    start, end = (
        await conn.execute(
            sa.select(
                sa.func.min(sa.func.lower(allocations.c.during)),
                sa.func.max(sa.func.upper(allocations.c.during)),
            ).where(allocations.c.reservation_id == row.id, allocations.c.planned.is_(True))
        )
    ).one()
    if start is None:  # no planned allocation left (not expected): it waits as any pending one
        return await _unplanned(conn, row)
    body = ReservationRequest.model_validate({**row.spec, "idempotencyKey": row.idempotency_key})
    amounts = quota_amounts(placement_request(config, body, now))
    attempt = await conn.begin_nested()
    try:
        await start_plan(conn, row.id)
        await charge(conn, row.tenant_id, row.pool_id, row.id, amounts, start, end)
    except QuotaExceeded as exc:
        await attempt.rollback()
        for pool_id in await drop_plans(conn, [row.id]):
            await notify_pool(conn, pool_id)  # wake edge: the planned window is free again
        story = from_stored(without_planned(row.conditions))
        message = f"fits, but the quota does not hold at its planned start: {exc.message}"
        conditions = stored(with_unschedulable(story, QUOTA_EXCEEDED, message))
        await _update(conn, row.id, planned_start=None, conditions=conditions)
        return Planning(row.id, QUOTA_REFUSED)
    await attempt.commit()
    waited = max((now - row.created_at).total_seconds(), 0.0)
    await _update(
        conn,
        row.id,
        status="placed",
        ends_at=end,
        planned_start=None,
        conditions=placed_conditions(without_planned(row.conditions), now, waited),
    )
    return Planning(row.id, PLACED_NOW, start)


async def start_all_planned(engine: AsyncEngine, config: CapacityConfig) -> int:
    """The ``start-planned`` lifecycle task: :func:`start_planned` in batches until none is due; returns
    how many it placed or refused."""
    total = 0
    while started := await start_planned(engine, config):
        total += len(started)
    return total
