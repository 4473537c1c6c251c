"""The lifecycle controller: a small registry of periodic tasks, one controller per service process
(docs/lifecycle.md).

Every service process runs the same tasks; each task must therefore be safe with several replicas
(claim rows with ``FOR UPDATE SKIP LOCKED``, write with guarded statements), so that a task done by one
replica is simply not found by the others. A task runs every ``interval`` seconds, and sooner when
:meth:`Lifecycle.poke` names it (an edge heard in this process). A failing run is logged and retried at
the next tick; it never stops the controller.

Built in: ``end-reservations`` (placed reservations whose window is over become ``ended``, and so do
pending ones whose explicit start passed and waiting ones whose deadline passed). Other parts
add their own task to :func:`default_tasks` (or pass more to :class:`Lifecycle`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.answers.reservations import Condition
from app.capacity.commit.plans import drop_plans
from app.capacity.conditions import (
    DEADLINE_PASSED,
    WINDOW_ENDED,
    WINDOW_PASSED,
    deadline_passed_condition,
    ended_condition,
    window_passed_condition,
)
from app.capacity.config import END_BATCH
from app.capacity.edges import notify_pool
from app.capacity.placing.inline import db_now
from app.capacity.reservations.release import close_reservation
from app.db.tables import TS, reservations
from app.observability.metrics import RESERVATIONS_ENDED
from app.placement.request import EARLIEST


async def end_reservations(
    engine: AsyncEngine, now: datetime | None = None, limit: int = END_BATCH
) -> list[str]:
    """Move placed reservations whose window is over at ``now`` (default: the database clock) to
    ``ended`` with the condition ``Ended`` / ``WindowEnded``; returns their ids, oldest end first.

    Safe with several replicas: the rows are claimed with ``FOR UPDATE SKIP LOCKED``, so two sweeps never
    wait for each other, and a row another sweep ended meanwhile no longer matches ``status = 'placed'``
    when its lock is taken (PostgreSQL re-checks a locked row), so each reservation is ended once.
    Nothing is refunded: its bookings and holdings stopped counting at the end of their window."""
    async with engine.begin() as conn:
        at = now if now is not None else await db_now(conn)
        # SELECT id, ends_at, conditions FROM reservations
        #  WHERE status = 'placed' AND ends_at <= :now ORDER BY ends_at LIMIT :limit FOR UPDATE SKIP LOCKED
        due = await _claim_due(
            conn,
            (reservations.c.pool_id, reservations.c.ends_at),
            (reservations.c.status == "placed", reservations.c.ends_at <= at),
            reservations.c.ends_at,
            limit,
        )
        await _mark_ended(conn, [(r.id, r.conditions, ended_condition(r.ends_at)) for r in due])
        for pool_id in sorted({r.pool_id for r in due}):
            await notify_pool(conn, pool_id)  # wake edge: an end (what was held stopped counting)
    RESERVATIONS_ENDED.labels(WINDOW_ENDED).inc(len(due))
    return [r.id for r in due]


async def end_passed_windows(
    engine: AsyncEngine, now: datetime | None = None, limit: int = END_BATCH
) -> list[str]:
    """Move pending reservations with an explicit ``start`` at or before ``now`` (default: the database
    clock) to ``ended`` with the condition ``Ended`` / ``WindowPassed``; returns their ids, oldest start
    first. A pending reservation holds nothing, so nothing is freed. Replica-safe as
    :func:`end_reservations` (``FOR UPDATE SKIP LOCKED``, then ``status = 'pending'`` re-checked)."""
    # a pending "earliest" reservation has no explicit start: it waits like one without (docs/lifecycle.md)
    start = sa.cast(sa.func.nullif(reservations.c.spec["start"].astext, EARLIEST), TS)
    async with engine.begin() as conn:
        at = now if now is not None else await db_now(conn)
        # SELECT id, nullif(spec->>'start', 'earliest')::timestamptz AS start, conditions FROM reservations
        #  WHERE status = 'pending' AND spec->>'start' IS NOT NULL
        #    AND nullif(spec->>'start', 'earliest')::timestamptz <= :now
        #  ORDER BY 2 LIMIT :limit FOR UPDATE SKIP LOCKED
        due = await _claim_due(
            conn,
            (start.label("start"),),
            (
                reservations.c.status == "pending",
                reservations.c.spec["start"].astext.is_not(None),
                start <= at,
            ),
            start,
            limit,
        )
        await _mark_ended(conn, [(r.id, r.conditions, window_passed_condition(r.start)) for r in due])
    RESERVATIONS_ENDED.labels(WINDOW_PASSED).inc(len(due))
    return [r.id for r in due]


# ``status IN ('pending', 'queued')`` with the literals in the SQL text, so that the plan can prove the
# partial index ix_reservations_waiting_deadline's predicate (bound values could not prove it)
IS_WAITING = reservations.c.status.in_([sa.literal_column("'pending'"), sa.literal_column("'queued'")])


async def end_passed_deadlines(
    engine: AsyncEngine, now: datetime | None = None, limit: int = END_BATCH
) -> list[str]:
    """Move pending and queued reservations whose ``deadline`` is at or before ``now`` (default: the
    database clock) to ``ended`` with the condition ``Ended`` / ``DeadlinePassed``; returns their ids,
    earliest deadline first (docs/lifecycle.md, "Deadlines").

    A waiting reservation holds no quota and nothing but its planned window, if any (docs/lifecycle.md,
    "Planned starts"): that is dropped, with a wake edge for its pool. Replica-safe as
    :func:`end_reservations`: the rows are claimed ``FOR UPDATE SKIP LOCKED`` (a wake placing one holds
    its row, and is skipped; a queued one in a batch worker's claim too), and PostgreSQL re-checks
    ``status`` on a row it locks, so one placed, released or ended meanwhile is not ended here, and each
    reservation is ended once."""
    async with engine.begin() as conn:
        at = now if now is not None else await db_now(conn)
        # SELECT id, status, deadline, conditions FROM reservations
        #  WHERE status IN ('pending', 'queued') AND deadline <= :now
        #  ORDER BY deadline LIMIT :limit FOR UPDATE SKIP LOCKED       -- ix_reservations_waiting_deadline
        due = await _claim_due(
            conn,
            (reservations.c.status, reservations.c.deadline),
            (IS_WAITING, reservations.c.deadline <= at),
            reservations.c.deadline,
            limit,
        )
        ended = [(r.id, r.conditions, deadline_passed_condition(r.deadline, r.status)) for r in due]
        await _mark_ended(conn, ended)
        for pool_id in await drop_plans(conn, [r.id for r in due]):
            await notify_pool(conn, pool_id)  # wake edge: a planned window is free again
    RESERVATIONS_ENDED.labels(DEADLINE_PASSED).inc(len(due))
    return [r.id for r in due]


async def _claim_due(
    conn: AsyncConnection, columns: tuple[Any, ...], where: tuple[Any, ...], order: Any, limit: int
) -> list[Any]:
    """The sweeps' claim: ``SELECT id, <columns>, conditions FROM reservations WHERE <where> ORDER BY
    <order> LIMIT :limit FOR UPDATE OF reservations SKIP LOCKED``; rows another sweep holds are skipped,
    and PostgreSQL re-checks ``where`` on a row it locks, so each is claimed by one sweep."""
    statement = (
        sa.select(reservations.c.id, *columns, reservations.c.conditions)
        .where(*where)
        .order_by(order)
        .limit(limit)
        .with_for_update(of=reservations, skip_locked=True)
    )
    return list((await conn.execute(statement)).all())


async def _mark_ended(
    conn: AsyncConnection, rows: list[tuple[str, list[dict[str, Any]] | None, Condition]]
) -> None:
    """Set each claimed ``(id, conditions, ended condition)`` reservation ``ended``, the condition added."""
    for reservation_id, conditions, ended in rows:
        await close_reservation(conn, reservation_id, "ended", conditions, ended)


log = logging.getLogger("better_compute.lifecycle")

END_RESERVATIONS = "end-reservations"


@dataclass(frozen=True, slots=True)
class LifecycleTask:
    """A periodic task: ``run(engine)`` every ``interval`` seconds; it returns anything (ignored)."""

    name: str
    interval: float
    run: Callable[[AsyncEngine], Awaitable[Any]]


async def _end_all_due(engine: AsyncEngine) -> int:
    """End every reservation that is due, in batches: placed ones whose window is over
    (``WindowEnded``), then pending ones whose explicit start passed (``WindowPassed``), then pending or
    queued ones whose deadline passed (``DeadlinePassed``); returns how many were ended."""
    total = 0
    for end in (end_reservations, end_passed_windows, end_passed_deadlines):
        while True:
            ended = await end(engine)
            total += len(ended)
            if not ended:
                break
    return total


def default_tasks(interval: float) -> list[LifecycleTask]:
    """The tasks every service process runs, each every ``interval`` seconds (``BC_LIFECYCLE_INTERVAL``)."""
    return [LifecycleTask(END_RESERVATIONS, interval, _end_all_due)]


class Lifecycle:
    """Runs :class:`LifecycleTask` s on one engine as asyncio tasks of the current loop.

    ``start()`` in the application's lifespan, ``await stop()`` before the engine is disposed."""

    def __init__(self, engine: AsyncEngine, tasks: Iterable[LifecycleTask]) -> None:
        self.engine = engine
        self.tasks = {t.name: t for t in tasks}
        self._wake = {name: asyncio.Event() for name in self.tasks}
        self._running: list[asyncio.Task[None]] = []
        self._stopping = False
        self.runs: dict[str, int] = dict.fromkeys(self.tasks, 0)  # completed runs per task

    def start(self) -> None:
        """Start every task (idempotent)."""
        if not self._running:
            self._stopping = False
            self._running = [
                asyncio.create_task(self._loop(t), name=f"lifecycle:{t.name}") for t in self.tasks.values()
            ]

    def poke(self, name: str) -> None:
        """Run the task ``name`` now instead of at its next tick (unknown names are ignored)."""
        event = self._wake.get(name)
        if event is not None:
            event.set()

    async def stop(self) -> None:
        """Stop every task and wait for them to finish: no new run starts, and a task is cancelled
        again until it is done (a cancellation swallowed by a library in a run is not the end of it)."""
        self._stopping = True
        running, self._running = self._running, []
        for task in running:
            task.cancel()
        for task in running:
            while not task.done():
                await asyncio.wait({task}, timeout=1.0)
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                task.result()

    async def _loop(self, task: LifecycleTask) -> None:
        wake = self._wake[task.name]
        while not self._stopping:
            wake.clear()  # before the run: a poke during the run makes the next run start at once
            try:
                await task.run(self.engine)
                self.runs[task.name] += 1
            except asyncio.CancelledError:
                raise
            except Exception:  # a database outage or a bug in one run: log it and try at the next tick
                log.exception("lifecycle task %s failed", task.name)
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that arrives
            # together with the poke it was waiting for, and stop() would wait for ever
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(task.interval):
                    await wake.wait()
