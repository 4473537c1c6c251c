"""The pool-lease queue (seed 000, "Two placers"; docs/scaling.md): enqueue, the batch worker every
replica runs, and the long-poll of ``GET /v1/reservations/{id}?waitSeconds=N``.

- **enqueue** (:func:`create`): with ``BC_CAPACITY_PLACER=pool-lease`` a plain reservation is written
  ``queued`` (the pool-lease placer, :class:`app.capacity.placers.PoolLeasePlacer`) and the pool's queue
  edge is sent (``NOTIFY bc_queue, <pool id>``); nothing is charged or booked yet. Gangs and whole-node
  leases are created inline whatever the setting.
- **the worker** (:class:`QueueWorker`, two lifecycle tasks): a LISTEN connection on ``bc_queue`` and
  ``bc_decided`` pokes the worker task, which takes the pools it heard about (and, every
  ``BC_LIFECYCLE_SWEEP`` seconds and after each (re)connection, every pool with queued work) and, per
  pool, claims up to ``maxBatch`` queued reservations oldest first with ``FOR UPDATE SKIP LOCKED`` and
  decides them in one transaction (:func:`app.capacity.batch.place_batch`). Queued rows another worker
  holds are skipped and looked at again after ``BUSY_RETRY`` seconds while any remain: when that worker
  dies (its transaction rolled back) this one takes them. An idle worker waits on its event: no query.
- **decided**: placed, or pending with its Unschedulable condition (``NoFit``, ``the pool is archived``,
  or ``QuotaExceeded`` until a quota edge of its tenant wakes it); the batch sends
  ``NOTIFY bc_decided, <ids>`` and every replica's long-polls of those ids return.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.capacity.batch import BatchEntry, batch_options, place_batch
from app.capacity.intake import Decision, insert_reservations, mark_decided
from app.capacity.listener import ListeningController
from app.capacity.placer import Pending, Placed, db_now
from app.capacity.placers import (
    DECIDED_CHANNEL,
    POOL_LEASE,
    QUEUE_CHANNEL,
    PlacementContext,
    placer,
)
from app.capacity.reservations import (
    CapacityConfig,
    _condition,
    _shape,
    _view,
    check_start,
    create_reservation,
    get_reservation,
    placement_request,
    quota_amounts,
)
from app.capacity.snapshot import PoolCache
from app.db.tables import reservations
from app.observability.metrics import (
    PLACEMENT_BATCH_SIZE,
    QUEUED_DECIDED,
    QUEUED_WAIT,
    count_batch_attempts,
)
from app.placement.request import ReservationRequest

log = logging.getLogger("better_compute.queue")

QUEUE_WORKER = "pool-lease-worker"
QUEUE_LISTENER = "pool-lease-listener"
BUSY_RETRY = 0.5  # seconds: queued rows another worker holds are looked at again this soon
LISTENER_RETRY = 1.0
RECHECK_SECONDS = 1.0  # a long-poll re-reads at least this often (a release sends no decided edge)
MAX_WAIT_SECONDS = 30
QUOTA_EXCEEDED_REASON = "QuotaExceeded"  # as the wake-edge controller's


def queues(config: CapacityConfig, body: ReservationRequest) -> bool:
    """Does this create go to the queue? Pool-lease configured, and not a gang or whole-node lease."""
    return config.placer == POOL_LEASE and body.gang is None and body.binding != "node"


async def create(
    engine: AsyncEngine, cache: PoolCache, config: CapacityConfig, body: ReservationRequest
) -> tuple[dict[str, Any], bool]:
    """``POST /v1/reservations``: ``(view, created)``, queued with the pool-lease placer (or inline, see
    :func:`queues`). Raises NotFound (pool), IdempotencyKeyReused, InvalidInput (``start``); with the
    inline placer also QuotaExceeded. On any error nothing is written."""
    if not queues(config, body):
        return await create_reservation(engine, cache, config, body)
    async with engine.begin() as conn:
        (written,) = await insert_reservations(conn, [body])
        if written.error is not None:
            raise written.error
        row = written.row
        if not written.created:
            return await _view(conn, row), False
        check_start(body, row.created_at, config.max_lead)  # raising rolls the row back
        request = placement_request(config, body, row.created_at)
        context = PlacementContext(
            row.created_at, cache, config.options, row.id, config.max_attempts, config.shortlist_min
        )
        await placer(POOL_LEASE).place(conn, request, context)
        return {**_shape(row, []), "status": "queued"}, True


# ------------------------------------------------------------------------------------ one batch


async def _claim(conn: AsyncConnection, pool_id: str, limit: int) -> list[Any]:
    # SELECT * FROM reservations WHERE pool_id = :pool AND status = 'queued'
    #  ORDER BY created_at, id LIMIT :max_batch FOR UPDATE SKIP LOCKED
    stmt = (
        sa.select(reservations)
        .where(reservations.c.pool_id == pool_id, reservations.c.status == "queued")
        .order_by(reservations.c.created_at, reservations.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return list((await conn.execute(stmt)).all())


def _decision(entry: BatchEntry | None, row: Any, reason: str | None = None) -> Decision:
    """The queued row's decision: placed (over its window), pending with the plan's reason, or pending
    with ``QuotaExceeded`` when the charge was refused."""
    if entry is None:
        return Decision(row.id, "pending", _condition(reason or ""))
    if entry.refused is not None:
        return Decision(
            row.id,
            "pending",
            [
                {
                    "type": "Unschedulable",
                    "status": "True",
                    "reason": QUOTA_EXCEEDED_REASON,
                    "message": entry.refused.message,
                }
            ],
        )
    if isinstance(entry.outcome, Placed):
        return Decision(row.id, "placed", entry.conditions, entry.request.end)
    assert isinstance(entry.outcome, Pending)
    return Decision(row.id, "pending", _condition(entry.outcome.reason))


async def work_batch(engine: AsyncEngine, cache: PoolCache, config: CapacityConfig, pool_id: str) -> int:
    """Claim and decide up to ``config.max_batch`` queued reservations of ``pool_id`` in one
    transaction; returns how many were claimed (0: none claimable)."""
    tokens: list[int] = []
    try:
        async with engine.begin() as conn:
            rows = await _claim(conn, pool_id, config.max_batch)
            if not rows:
                return 0
            now = await db_now(conn)
            entries: dict[str, BatchEntry] = {}
            passed: set[str] = set()
            for row in rows:
                body = ReservationRequest.model_validate({**row.spec, "idempotencyKey": row.idempotency_key})
                if body.start is not None and body.start <= now:
                    passed.add(row.id)  # its window passed while queued: pending, the end task ends it
                    continue
                request = placement_request(config, body, now)
                entries[row.id] = BatchEntry(row.id, request, quota_amounts(request))
            opts = batch_options(config)
            tokens = await place_batch(conn, cache, opts, pool_id, list(entries.values()))
            passed_reason = "the start passed while the reservation was queued"
            decisions = [
                _decision(entries.get(r.id), r, passed_reason if r.id in passed else None) for r in rows
            ]
            await mark_decided(conn, decisions)
            await notify_decided(conn, [r.id for r in rows])
            _observe(rows, decisions, now)
            return len(rows)
    finally:  # committed or rolled back: the bookings (or their absence) are visible to every plan
        for token in tokens:
            cache.forget(pool_id, token)


def _observe(rows: list[Any], decisions: list[Decision], now: Any) -> None:
    PLACEMENT_BATCH_SIZE.labels(POOL_LEASE).observe(len(rows))
    count_batch_attempts(POOL_LEASE, [d.status for d in decisions])
    for row, d in zip(rows, decisions, strict=True):
        QUEUED_DECIDED.labels(d.status).inc()
        QUEUED_WAIT.observe(max((now - row.created_at).total_seconds(), 0.0))


async def notify_decided(conn: AsyncConnection, reservation_ids: list[str]) -> None:
    """Send ``bc_decided`` with the ids (comma-separated, in chunks under NOTIFY's 8000-byte limit)."""
    chunk: list[str] = []
    for rid in [*reservation_ids, None]:
        if rid is not None and sum(len(c) + 1 for c in chunk) + len(rid) < 7000:
            chunk.append(rid)
            continue
        if chunk:
            # SELECT pg_notify('bc_decided', :ids)
            await conn.execute(sa.select(sa.func.pg_notify(DECIDED_CHANNEL, ",".join(chunk))))
        chunk = [rid] if rid is not None else []


async def pools_with_queued(conn: AsyncConnection, pool_id: str | None = None) -> list[str]:
    """The pools that have queued reservations (plain read: rows other workers hold count too)."""
    # SELECT DISTINCT pool_id FROM reservations WHERE status = 'queued' [AND pool_id = :pool]
    stmt = sa.select(reservations.c.pool_id).where(reservations.c.status == "queued").distinct()
    if pool_id is not None:
        stmt = stmt.where(reservations.c.pool_id == pool_id)
    return list((await conn.execute(stmt.order_by(reservations.c.pool_id))).scalars())


# ------------------------------------------------------------------------------------ the worker


class QueueWorker(ListeningController[str]):
    """The batch worker of one service process: :meth:`listen` (LISTEN on the queue and decided
    channels) and :meth:`run` (decide the queued work of the pools heard about); ``poke`` starts a run
    now (set once the lifecycle exists). Also the in-process hub of long-polls (:meth:`wait`)."""

    @functools.cached_property
    def _watchers(self) -> dict[str, set[asyncio.Event]]:
        """Reservation id -> the events of the long-polls waiting on it."""
        return defaultdict(set)

    def channels(self) -> Mapping[str, Callable[[str], None]]:
        return {QUEUE_CHANNEL: self.heard_queue, DECIDED_CHANNEL: self.heard_decided}

    def heard_queue(self, pool_id: str) -> None:
        """A queue edge of ``pool_id``: remember it and start a run."""
        self._heard.add(pool_id)
        self.poke()

    def heard_decided(self, payload: str) -> None:
        """A ``bc_decided`` payload: wake the long-polls of those reservations."""
        for rid in payload.split(","):
            for event in self._watchers.get(rid, ()):
                event.set()

    async def run(self, engine: AsyncEngine) -> int:
        """One run: each pool heard about (every pool with queued work when the sweep is due), batch
        after batch until none is claimable; returns how many reservations were decided here."""
        targets, self._heard = self._heard, set()
        if self.sweep_due():
            async with engine.connect() as conn:
                targets |= set(await pools_with_queued(conn))
        decided = 0
        busy = False
        for pool_id in sorted(targets):
            while (n := await work_batch(engine, self.cache, self.config, pool_id)) > 0:
                decided += n
            async with engine.connect() as conn:
                if await pools_with_queued(conn, pool_id):  # held by another worker: look again soon
                    self._heard.add(pool_id)
                    busy = True
        if busy:
            asyncio.get_running_loop().call_later(BUSY_RETRY, self.poke)
        return decided

    async def wait(
        self, engine: AsyncEngine, reservation_id: str, tenant_id: str | None, seconds: int
    ) -> dict[str, Any]:
        """The reservation view once it is no longer ``queued``, or after ``seconds`` (0..30) as it is
        then. Woken by ``bc_decided``; re-read at least every ``RECHECK_SECONDS``. Holds no connection
        while waiting. Raises NotFound as :func:`~app.capacity.reservations.get_reservation`."""
        event = asyncio.Event()
        self._watchers[reservation_id].add(event)
        deadline = asyncio.get_running_loop().time() + seconds
        try:
            while True:
                view = await get_reservation(engine, reservation_id, tenant_id)
                remaining = deadline - asyncio.get_running_loop().time()
                if view["status"] != "queued" or remaining <= 0:
                    return view
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(remaining, RECHECK_SECONDS)):
                        await event.wait()
                event.clear()
        finally:
            watchers = self._watchers.get(reservation_id)
            if watchers is not None:
                watchers.discard(event)
                if not watchers:
                    del self._watchers[reservation_id]
