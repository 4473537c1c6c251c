"""The wake-edge controller (docs/lifecycle.md; docs/placement-rules.md, ``mayBeSchedulableSql``).

A pending reservation holds nothing but its planned window, if it has one (docs/lifecycle.md, "Planned
starts"), and waits. It is planned again when an edge may make it fit
(:mod:`app.capacity.edges` lists them and sends them with ``NOTIFY`` in the transaction that
caused
them). Every service process LISTENs on a connection it holds (:meth:`WakeController.listen`, a lifecycle
task) and pokes the ``wake-pending`` task, which plans the pending reservations of the pools (and
tenants) it heard about; a periodic sweep of every pool with pending work (``BC_LIFECYCLE_SWEEP``,
default 30 s) is the safety net for an edge that was missed (a listener reconnecting, a lost message).

Per pool the pending reservations are taken oldest first (``created_at, id``), one transaction each,
claimed with ``FOR UPDATE SKIP LOCKED``: two replicas hearing one edge never plan the same reservation,
and a row claimed by the other replica is not seen by this pass. That other transaction (a wake or the
planner's pass) may have read the pool before the edge committed, so a pass that leaves a pending
reservation of its target untried is run again once that lock is gone: after a short delay
(``RETRY_FIRST``, doubled with jitter each time up to the sweep period, reset by a pass that skipped
nothing); so is a target whose planner pass found the pool's planner lock taken. An edge is never lost
to a row lock. The claim re-checks ``status = 'pending'``
on the locked row (PostgreSQL re-evaluates the WHERE of a locked row), so a reservation placed or
released meanwhile is skipped. One that still does not fit is skipped and the next one is tried; the
oldest ones hold planned windows that the younger ones cannot overlap (the planner's pass after the
wakes of a pool, :mod:`app.capacity.controllers.backfill`), so a large request is not starved by the
small ones behind it. A woken reservation that fits now drops its own plan first, in the same savepoint.

Placing a woken reservation is creation's path: the inline placer plans and commits with the guarded
statements, which charge quota last (a pending one holds nothing). It is placed at
``[now, now + duration)`` when it has no explicit ``start``, else for its own window; one whose explicit
start passed is ended by the lifecycle's end task (``WindowPassed``), never placed late; so is one whose
window would start at or after its ``deadline`` (``DeadlinePassed``, docs/lifecycle.md). A reservation
that fits but whose tenant's quota does not hold now stays pending (condition reason ``QuotaExceeded``)
until a quota edge of its tenant. A placed one gets the condition ``Scheduled`` with the time it waited.

Repair first (docs/lifecycle.md): BookingRepair is not part of a wake. It runs on its own task
(:mod:`app.capacity.controllers.repair_first`), and the wake loop yields to it: before each pending
reservation it
claims, :func:`wake_pool` awaits ``yield_to`` (:meth:`RepairController.wait_for_repairs`), so a repair
asked for during a wake or a sweep of hundreds of pending reservations waits for one of them at most.

Lock order: the reservation row first (as create and release), then pools -> nodes -> devices ->
node_resources -> quota_usage, as every capacity transaction.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.answers.reservations import Condition
from app.capacity.commit.plans import drop_plans
from app.capacity.commit.shapes import QuotaCharge
from app.capacity.conditions import (
    NO_FIT,
    QUOTA_EXCEEDED,
    UNSCHEDULABLE,
    condition,
    from_stored,
    stored,
    with_unschedulable,
    without_planned,
)
from app.capacity.config import CapacityConfig
from app.capacity.controllers.listener import ListeningController
from app.capacity.controllers.repair import REPAIR_PREFIX
from app.capacity.edges import WAKE_CHANNEL, parse_wake_payload
from app.capacity.placing.inline import Placed, db_now
from app.capacity.placing.registry import INLINE, WAKE, Admission, PlacementContext, placer
from app.capacity.planning.snapshot import PoolCache
from app.capacity.requests import placement_request, quota_amounts
from app.db.tables import reservations
from app.errors import QuotaExceeded
from app.observability.metrics import WAKE_EDGES_HEARD, WAKE_WAIT, WAKES
from app.placement.request import ReservationRequest, deadline_passed
from app.placement.why_not import WhyNot

log = logging.getLogger("better_compute.wake")

WAKE_PENDING = "wake-pending"
WAKE_LISTENER = "wake-listener"
WAKE_BATCH = 1000  # reservations tried per pool and wake, at most (the rest at the next edge or sweep)
LISTENER_RETRY = 1.0  # seconds between two attempts to (re)connect the listener
RETRY_FIRST = 0.05  # seconds before a target whose pass skipped a locked reservation is tried again

PLACED, STILL_PENDING, QUOTA_EXCEEDED_RESULT = "placed", "pending", "quota_exceeded"
SCHEDULED = "Scheduled"  # the condition type
WOKEN_REASON = "Woken"


@dataclass(frozen=True, slots=True)
class Woken:
    """What one wake did with one pending reservation: ``result`` placed / pending / quota_exceeded."""

    reservation_id: str
    result: str
    waited_seconds: float | None = None  # placed: creation -> placement


def scheduled_condition(at: datetime, waited_seconds: float) -> Condition:
    """The condition of a pending reservation placed by a wake, with the time it waited (seconds)."""
    return condition(
        SCHEDULED,
        WOKEN_REASON,
        f"placed after waiting {waited_seconds:.3f} s",
        at=at.isoformat(),
        waitedSeconds=round(waited_seconds, 6),
    )


def placed_conditions(
    conditions: list[dict[str, Any]] | None, at: datetime, waited: float
) -> list[dict[str, Any]]:
    """The stored conditions of a woken (or planned, docs/lifecycle.md "Planned starts"), placed
    reservation: Unschedulable turns ``False``, a Planned condition goes, Scheduled is added."""
    story = [
        c.model_copy(update={"status": "False"}) if c.type == UNSCHEDULABLE else c
        for c in from_stored(without_planned(conditions))
    ]
    return stored([*story, scheduled_condition(at, waited)])


async def _claim_next(
    conn: AsyncConnection, pool_id: str, tenant_id: str | None, after: tuple[datetime, str] | None
) -> Any:
    # SELECT * FROM reservations
    #  WHERE pool_id = :pool AND status = 'pending' [AND tenant_id = :tenant]
    #    [AND (created_at, id) > (:created_at, :id)]
    #  ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED
    stmt = (
        sa.select(reservations)
        .where(reservations.c.pool_id == pool_id, reservations.c.status == "pending")
        .order_by(reservations.c.created_at, reservations.c.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    if tenant_id is not None:
        stmt = stmt.where(reservations.c.tenant_id == tenant_id)
    if after is not None:
        stmt = stmt.where(sa.tuple_(reservations.c.created_at, reservations.c.id) > sa.tuple_(*after))
    return (await conn.execute(stmt)).first()


async def _wake_one(
    conn: AsyncConnection, cache: PoolCache, config: CapacityConfig, row: Any, assumptions: list[int]
) -> Woken:
    """Plan the claimed pending reservation ``row`` again and place it when it fits (in ``conn``'s
    transaction); the cache assumptions of a placement are appended to ``assumptions``."""
    now = await db_now(conn)
    body = ReservationRequest.model_validate({**row.spec, "idempotencyKey": row.idempotency_key})
    if body.fixed_start is not None and body.fixed_start <= now:
        return Woken(row.id, STILL_PENDING)  # its window passed: the end task ends it (WindowPassed)
    request = placement_request(config, body, now)
    assert request.start is not None and request.end is not None
    if deadline_passed(row.deadline, request.start):
        return Woken(row.id, STILL_PENDING)  # too late to start: the end task ends it (DeadlinePassed)
    charge = QuotaCharge(
        row.tenant_id, row.pool_id, row.id, quota_amounts(request), request.start, request.end
    )
    attempt = await conn.begin_nested()  # SAVEPOINT: a refused charge or no fit leaves nothing behind
    try:
        if row.planned_start is not None:  # its own plan goes first (restored with the savepoint)
            await drop_plans(conn, [row.id])
        context = PlacementContext(
            now,
            cache,
            config.options,
            row.id,
            config.max_attempts,
            config.shortlist_min,
            Admission(row.tenant_id, charge.amounts, charge),
            recorded_as=WAKE,
        )
        outcome = await placer(INLINE).place(conn, request, context)  # a wake always places inline
    except QuotaExceeded as exc:
        await attempt.rollback()
        message = f"fits, but the quota does not hold now: {exc.message}"
        await _set_pending(conn, row, QUOTA_EXCEEDED, message)
        return Woken(row.id, QUOTA_EXCEEDED_RESULT)
    if not isinstance(outcome, Placed):
        await attempt.rollback()  # a charge made before every commit lost its race goes too
        await _set_pending(conn, row, NO_FIT, outcome.reason, outcome.why)
        return Woken(row.id, STILL_PENDING)
    await attempt.commit()
    assumptions.extend(outcome.assumptions)
    waited = max((now - row.created_at).total_seconds(), 0.0)
    await conn.execute(
        sa.update(reservations)
        .where(reservations.c.id == row.id)
        .values(
            status="placed",
            conditions=placed_conditions(row.conditions, now, waited),
            ends_at=request.end,
            planned_start=None,
            updated_at=sa.func.now(),
        )
    )
    return Woken(row.id, PLACED, waited)


async def _set_pending(
    conn: AsyncConnection, row: Any, reason: str, message: str, why: WhyNot | None = None
) -> None:
    """Keep the reservation pending with its Unschedulable condition updated to the latest plan (a
    reservation a repair sent back to pending keeps saying so: ``repair: <latest summary>``)."""
    story = from_stored(row.conditions)
    was = next((c for c in story if c.type == UNSCHEDULABLE), None)
    if was is not None and was.message.startswith(REPAIR_PREFIX) and reason == NO_FIT:
        message = REPAIR_PREFIX + message
    conditions = stored(with_unschedulable(story, reason, message, why))
    if conditions != (row.conditions or []):
        await conn.execute(
            sa.update(reservations)
            .where(reservations.c.id == row.id)
            .values(conditions=conditions, updated_at=sa.func.now())
        )


async def wake_pool(
    engine: AsyncEngine,
    cache: PoolCache,
    config: CapacityConfig,
    pool_id: str,
    tenant_id: str | None = None,
    limit: int = WAKE_BATCH,
    yield_to: Callable[[], Awaitable[None]] | None = None,
) -> list[Woken]:
    """Plan the pending reservations of ``pool_id`` (of ``tenant_id`` only, when given) again, oldest
    first, one transaction each; one that still does not fit is skipped and the next one tried. Before
    each claim it awaits ``yield_to()`` when given (the repair controller's
    :meth:`~app.capacity.controllers.repair_first.RepairController.wait_for_repairs`: repair first,
    docs/lifecycle.md).
    Returns what happened to each reservation tried (at most ``limit``), in the order tried."""
    woken: list[Woken] = []
    after: tuple[datetime, str] | None = None
    while len(woken) < limit:
        if yield_to is not None:
            await yield_to()  # a repair asked for meanwhile commits before the next reservation is claimed
        assumptions: list[int] = []
        try:
            async with engine.begin() as conn:
                row = await _claim_next(conn, pool_id, tenant_id, after)
                if row is None:
                    break
                after = (row.created_at, row.id)
                result = await _wake_one(conn, cache, config, row, assumptions)
        finally:  # committed or rolled back: the bookings (or their absence) are visible to every plan
            for token in assumptions:
                cache.forget(pool_id, token)
        WAKES.labels(result.result).inc()
        if result.waited_seconds is not None:
            WAKE_WAIT.observe(result.waited_seconds)
        woken.append(result)
    return woken


async def untried_pending(engine: AsyncEngine, pool_id: str, tenant_id: str | None, tried: list[str]) -> bool:
    """True when ``pool_id`` (``tenant_id``'s reservations only, when given) has a pending reservation
    not in ``tried``: after a whole pass, one another transaction held (or one created since)."""
    # SELECT EXISTS (SELECT 1 FROM reservations WHERE pool_id = :pool AND status = 'pending'
    #                 [AND tenant_id = :tenant] AND id <> ALL(:tried))
    where = [reservations.c.pool_id == pool_id, reservations.c.status == "pending"]
    if tenant_id is not None:
        where.append(reservations.c.tenant_id == tenant_id)
    if tried:
        where.append(reservations.c.id.not_in(tried))
    async with engine.connect() as conn:
        return bool((await conn.execute(sa.select(sa.exists().where(*where)))).scalar())


async def pools_with_pending(conn: AsyncConnection) -> list[str]:
    """The pools that have pending reservations (the sweep wakes each)."""
    # SELECT DISTINCT pool_id FROM reservations WHERE status = 'pending' ORDER BY pool_id
    stmt = (
        sa.select(reservations.c.pool_id)
        .where(reservations.c.status == "pending")
        .distinct()
        .order_by(reservations.c.pool_id)
    )
    return list((await conn.execute(stmt)).scalars())


class WakeController(ListeningController[tuple[str, str | None]]):
    """The wake-edge controller of one service process: a LISTEN connection that collects the edges
    heard (:meth:`listen`) and the task that wakes the pools they name (:meth:`run`), with a full sweep
    at most every ``sweep_seconds``. ``poke`` (set once the lifecycle exists) starts :meth:`run` now;
    ``yield_to`` (set with the repair controller) is awaited before each pending reservation is claimed
    (repair first, docs/lifecycle.md)."""

    yield_to: Callable[[], Awaitable[None]] | None = None
    # the planner's pass over a pool, run after each wake of it (set in app/main.py:
    # app.capacity.controllers.backfill.plan_pool; docs/lifecycle.md, "Planned starts")
    plan_pool: Callable[[AsyncEngine, str], Awaitable[Any]] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._retry_delay: dict[tuple[str, str | None], float] = {}  # target -> its last delay (seconds)
        self._again: set[tuple[str, str | None]] = set()  # targets whose delay passed

    def channels(self) -> Mapping[str, Callable[[str], None]]:
        return {WAKE_CHANNEL: self.heard}

    def _again_later(self, target: tuple[str, str | None]) -> None:
        """Wake ``target`` again after the next delay of its backoff (module docstring)."""
        delay = min(self._retry_delay.get(target, RETRY_FIRST / 2) * 2, max(self.sweep_seconds, RETRY_FIRST))
        self._retry_delay[target] = delay
        asyncio.get_running_loop().call_later(delay * random.uniform(0.5, 1.0), self._heard_again, target)

    def _heard_again(self, target: tuple[str, str | None]) -> None:
        self._again.add(target)
        self.poke()

    def heard(self, payload: str) -> None:
        """An edge's payload arrived: remember its pool (and tenant) and start a wake."""
        target = parse_wake_payload(payload)
        if target is None:
            log.warning("ignored a %s notification that is not a wake edge: %r", WAKE_CHANNEL, payload[:200])
            return
        self._heard.add(target)
        self.poke()

    def _targets(self, swept: list[str]) -> list[tuple[str, str | None]]:
        heard, self._heard = self._heard, set()
        again, self._again = self._again, set()
        WAKE_EDGES_HEARD.labels("edge").inc(len(heard))
        WAKE_EDGES_HEARD.labels("retry").inc(len(again))
        heard |= again
        WAKE_EDGES_HEARD.labels("sweep").inc(len(swept))
        everyone = {pool for pool, tenant in heard if tenant is None} | set(swept)
        # an edge for every tenant of a pool covers the edges for one of its tenants
        return sorted(
            {(pool, None) for pool in everyone} | {(p, t) for p, t in heard if p not in everyone},
            key=lambda target: (target[0], target[1] or ""),
        )

    async def run(self, engine: AsyncEngine) -> list[Woken]:
        """One wake: the pools heard since the last wake, and every pool with pending work when the
        sweep is due, each reservation claimed after ``yield_to()`` (BookingRepair runs on its own task,
        ahead of this one). Returns what happened to each reservation tried."""
        swept: list[str] = []
        if self.sweep_due():
            async with engine.connect() as conn:
                swept = await pools_with_pending(conn)
        woken: list[Woken] = []
        targets = self._targets(swept)
        again: set[tuple[str, str | None]] = set()
        for target in targets:
            pool_id, tenant_id = target
            tried = await wake_pool(
                engine, self.cache, self.config, pool_id, tenant_id, yield_to=self.yield_to
            )
            woken += tried
            if len(tried) < WAKE_BATCH and await untried_pending(
                engine, pool_id, tenant_id, [w.reservation_id for w in tried]
            ):
                again.add(target)
        if self.plan_pool is not None:  # the planned starts, after the wakes: what fits now went first
            for pool_id in sorted({pool_id for pool_id, _ in targets}):
                if await self.plan_pool(engine, pool_id) is None:  # another replica is planning it
                    again |= {target for target in targets if target[0] == pool_id}
        for target in targets:
            if target not in again:
                self._retry_delay.pop(target, None)
        for target in sorted(again, key=lambda t: (t[0], t[1] or "")):
            self._again_later(target)
        return woken
