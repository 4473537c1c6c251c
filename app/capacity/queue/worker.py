"""The pool-lease queue (docs/placement-rules.md, "Two placers"; docs/scaling.md): enqueue, the batch
worker every
replica runs, and the long-poll of ``GET /v1/reservations/{id}?waitSeconds=N``.

- **enqueue** (:func:`create`): with ``BC_CAPACITY_PLACER=pool-lease`` a plain reservation is written
  ``queued`` and the pool's queue edge is sent (``NOTIFY bc_queue, <pool id>``) by one statement, (the
  pool-lease way of :mod:`app.capacity.placing.registry`); nothing is charged or booked
  yet. Gangs and whole-node leases are created inline whatever the setting.
- **the worker** (:class:`QueueWorker`, two lifecycle tasks): a LISTEN connection on ``bc_queue`` and
  ``bc_decided`` pokes the worker task, which takes the pools it heard about (and, every
  ``BC_LIFECYCLE_SWEEP`` seconds and after each (re)connection, every pool with queued work) and, per
  pool, leases the pool for one transaction (:func:`pool_lease`: one replica at a time plans a pool, so
  replicas' batches never race each other for atoms), claims up to ``maxBatch`` queued reservations
  oldest first with ``FOR UPDATE SKIP LOCKED`` and decides them in that transaction
  (:func:`app.capacity.placing.batch.place_batch`); a batch that took ``maxBatch`` is followed by another at
  once. The worker keeps each pool's batch reads warm (:class:`app.capacity.planning.shared_reads.WarmReads`,
  one :class:`~app.capacity.planning.shared_reads.WarmSlot` per pool):
  its next batch of an unchanged pool plans
  on the last committed batch's exceptions read and locks known quota rows in one statement.
  No debounce: the edges that arrive during a batch make the next run, which claims everything
  queued by then. The claim also counts the pool's queued rows it could not take: while another worker
  holds some (or the pool's lease), they are looked at again after ``BUSY_RETRY`` seconds; when that
  worker dies (its transaction rolled back) this one takes them. An idle worker waits on its event: no
  query.
- **decided**: placed, or pending with its Unschedulable condition (``NoFit``, ``the pool is archived``,
  or ``QuotaExceeded`` until a quota edge of its tenant wakes it); the batch sends ``bc_decided`` with a
  line ``<id>\t<view JSON>`` per reservation (:func:`decided_payloads`), and on every replica the
  long-polls of those ids, and only those, answer the view carried, with no read.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.answers.reservations import Reservation
from app.answers.statuses import ReservationStatus
from app.capacity.conditions import no_fit_conditions, quota_exceeded_conditions
from app.capacity.config import CapacityConfig
from app.capacity.controllers.listener import ListeningController
from app.capacity.placing.batch import BatchEntry, batch_options, place_batch
from app.capacity.placing.inline import Pending, Placed
from app.capacity.placing.registry import (
    DECIDED_CHANNEL,
    POOL_LEASE,
    QUEUE_CHANNEL,
    placer_id_for_request,
    queue_edge,
)
from app.capacity.planning.admission import admit
from app.capacity.planning.shared_reads import WarmSlot
from app.capacity.planning.snapshot import PoolCache, PoolHead
from app.capacity.queue.decided import decided_payloads, parse_decided, read_view_json
from app.capacity.queue.intake import Decision, decided_params, decided_update
from app.capacity.requests import check_start, placement_request, quota_amounts, row_values, spec_hash
from app.capacity.reservations.access import reservation_named, reservation_not_found
from app.capacity.reservations.create import create_reservation, idempotent_answer
from app.capacity.views import decided_view, read_view, row_view, with_warnings
from app.db.audit import note_created, note_status
from app.db.locks import pool_lease, pool_not_found
from app.db.prepared import Prepared
from app.db.tables import pools, reservations
from app.iam.authorize import Principal, authorize_owned
from app.ids import new_id
from app.observability.metrics import (
    PLACEMENT_BATCH_SIZE,
    QUEUED_DECIDED,
    QUEUED_WAIT,
    count_batch_attempts,
)
from app.placement.request import ReservationRequest, deadline_passed

log = logging.getLogger("better_compute.queue")

QUEUE_WORKER = "pool-lease-worker"
QUEUE_LISTENER = "pool-lease-listener"
BUSY_RETRY = 0.5  # seconds: queued rows another worker holds are looked at again this soon
LISTENER_RETRY = 1.0
RECHECK_SECONDS = 1.0  # a long-poll re-reads at least this often (a release sends no decided edge)
MAX_WAIT_SECONDS = 30
READ = "compute:reservations:read"
# ``status = 'queued'`` with the literal in the SQL text, so that even a generic plan of the prepared
# statement can use the partial index ix_reservations_queued (a bound status could not prove its WHERE)
IS_QUEUED = reservations.c.status == sa.literal_column("'queued'")
# the Unschedulable messages of a queued reservation decided too late to place (docs/lifecycle.md)
START_PASSED_WHILE_QUEUED = "the start passed while the reservation was queued"
DEADLINE_PASSED_WHILE_QUEUED = "the deadline passed while the reservation was queued"


def queues(config: CapacityConfig, body: ReservationRequest) -> bool:
    """Does this create go to the queue? The placer the registry picks for it is the pool-lease one
    (configured, and not a gang or whole-node lease:
    :func:`~app.capacity.placing.registry.placer_id_for_request`)."""
    return placer_id_for_request(config.placer, body) == POOL_LEASE


ACCEPTED = 202  # the answer of a queued create (docs/api.md)


async def create(
    engine: AsyncEngine,
    cache: PoolCache,
    config: CapacityConfig,
    body: ReservationRequest,
    if_plan: str | None = None,
) -> tuple[Reservation, bool]:
    """``POST /v1/reservations``: ``(view, created)``, queued with the pool-lease placer (or inline, see
    :func:`queues`). Raises NotFound (pool), IdempotencyKeyReused, InvalidInput (``start``); with the
    inline placer also QuotaExceeded. On any error nothing is written. ``if_plan`` (a preview's plan
    token) always commits inline, that plan or none (docs/api.md, "Plan tokens"; PlanStale).

    Queued: BEGIN, one statement (:func:`_enqueue`: the row written ``queued`` with the queue edge),
    COMMIT; an idempotent retry or an unknown pool reads more."""
    if if_plan is not None or not queues(config, body):
        return await create_reservation(engine, cache, config, body, if_plan=if_plan)
    spec = body.spec()
    digest = spec_hash(spec)
    async with engine.begin() as conn:
        row = await _enqueue(conn, body, spec, digest)
        if row is None:
            return await _not_enqueued(conn, body, digest), False
        note_created(row.id)  # the audit row written at COMMIT names it, answered 202 (app/db/audit.py)
        note_status(ACCEPTED)
        check_start(body, row.created_at, config.max_lead)  # raising rolls the row back
        request = placement_request(config, body, row.created_at)
        head = PoolHead(row.pool_id, row.pool_archived, row.inventory_version)  # read by the enqueue
        warnings = await admit(conn, cache, head, request)  # raising rolls the row back
        return with_warnings(row_view(row, []), warnings), True


# INSERT INTO reservations (id, tenant_id, pool_id, status, spec, spec_hash, idempotency_key, deadline)
#   SELECT :id, :tenant_id, p.id, 'queued', :spec, :spec_hash, :idempotency_key, :deadline FROM pools p
#    WHERE p.id = :pool_id
#   ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
#   RETURNING reservations.*, pg_notify('bc_queue', reservations.pool_id),
#     (SELECT head.archived_at IS NOT NULL FROM pools head WHERE head.id = reservations.pool_id)
#       AS pool_archived,
#     (SELECT head.inventory_version FROM pools head WHERE head.id = reservations.pool_id)
#       AS inventory_version
#   (the pool head for the intake check, without a round trip of its own)
ENQUEUE = Prepared(
    pg_insert(reservations)
    .from_select(
        ["id", "tenant_id", "pool_id", "status", "spec", "spec_hash", "idempotency_key", "deadline"],
        sa.select(
            sa.bindparam("id", type_=sa.Text),
            sa.bindparam("tenant_id", type_=sa.Text),
            pools.c.id,
            sa.literal("queued", sa.Text),
            sa.bindparam("spec", type_=JSONB),
            sa.bindparam("spec_hash", type_=sa.Text),
            sa.bindparam("idempotency_key", type_=sa.Text),
            sa.bindparam("deadline", type_=reservations.c.deadline.type),
        ).where(pools.c.id == sa.bindparam("pool_id", type_=sa.Text)),
    )
    .on_conflict_do_nothing(index_elements=["tenant_id", "idempotency_key"])
    .returning(
        *reservations.c,
        queue_edge(reservations.c.pool_id),
        # written as text: SQLAlchemy does not correlate a subquery of RETURNING to the inserted row
        sa.literal_column(
            "(SELECT head.archived_at IS NOT NULL FROM pools head WHERE head.id = reservations.pool_id)",
            sa.Boolean,
        ).label("pool_archived"),
        sa.literal_column(
            "(SELECT head.inventory_version FROM pools head WHERE head.id = reservations.pool_id)",
            sa.BigInteger,
        ).label("inventory_version"),
    )
)


async def _enqueue(conn: AsyncConnection, body: ReservationRequest, spec: dict[str, Any], digest: str) -> Any:
    """Write the reservation ``queued`` and send its pool's queue edge (delivered at COMMIT) in one
    statement (:data:`ENQUEUE`, prepared); the row as stored, or None when nothing was written (no such
    pool, or the key was used: :func:`_not_enqueued` tells which)."""
    params = {"id": new_id("res"), **row_values(body, spec, digest)}
    return (await ENQUEUE.run(conn, params)).first()


async def _not_enqueued(conn: AsyncConnection, body: ReservationRequest, digest: str) -> Reservation:
    """Why :func:`_enqueue` wrote nothing: NotFound (no such pool), IdempotencyKeyReused (the key was
    used with another body), else the view of the reservation made before with this key."""
    # SELECT id FROM pools WHERE id = :pool
    if (await conn.execute(sa.select(pools.c.id).where(pools.c.id == body.poolId))).first() is None:
        raise pool_not_found(body.poolId)
    return await idempotent_answer(conn, body, digest)


# ------------------------------------------------------------------------------------ one batch


@dataclass(frozen=True, slots=True)
class Claimed:
    """A claim: the rows (locked, oldest first), the database clock, and how many queued rows of the
    pool the claim saw that it did not take (held by another worker, or beyond the limit)."""

    rows: list[Any]
    now: datetime | None
    left: int


def _claim_statement() -> Prepared:
    # SELECT c.queued_total, c.db_now, c.leased, claimed.*
    #   FROM (SELECT count(*) AS queued_total, now() AS db_now,
    #                pg_try_advisory_xact_lock(<POOL_LEASE_LOCK>, hashtext(:pool_id)) AS leased
    #           FROM reservations WHERE pool_id = :pool_id AND status = 'queued') c
    #   LEFT JOIN LATERAL (SELECT * FROM reservations
    #          WHERE pool_id = :pool_id AND status = 'queued' AND c.leased
    #          ORDER BY created_at, id LIMIT :max_batch FOR UPDATE SKIP LOCKED) claimed ON true
    #  ORDER BY claimed.created_at, claimed.id
    queued = (reservations.c.pool_id == sa.bindparam("pool_id", type_=sa.Text), IS_QUEUED)
    counted = (
        sa.select(
            sa.func.count().label("queued_total"),
            sa.func.now().label("db_now"),
            pool_lease(sa.bindparam("pool_id", type_=sa.Text)).label("leased"),
        )
        .where(*queued)
        .subquery("counted")
    )
    claimed = (
        sa.select(reservations)
        .where(*queued, counted.c.leased)
        .order_by(reservations.c.created_at, reservations.c.id)
        .limit(sa.bindparam("max_batch", type_=sa.Integer))
        .with_for_update(skip_locked=True)
        .lateral("claimed")
    )
    return Prepared(
        sa.select(counted, claimed)
        .select_from(counted.outerjoin(claimed, sa.true()))
        .order_by(claimed.c.created_at, claimed.c.id)
    )


CLAIM = _claim_statement()


async def _claim(conn: AsyncConnection, pool_id: str, limit: int) -> Claimed:
    """Lease ``pool_id`` and claim up to ``limit`` of its queued reservations in one statement
    (:data:`CLAIM`, prepared), with ``now()`` and the count of the pool's queued rows (rows other
    workers hold are counted, not claimed; all of them while another replica holds the pool's lease,
    :func:`pool_lease`)."""
    result = (await CLAIM.run(conn, {"pool_id": pool_id, "max_batch": limit})).all()
    rows = [r for r in result if r.id is not None]
    return Claimed(rows, result[0].db_now, result[0].queued_total - len(rows))


def _decision(entry: BatchEntry | None, row: Any, reason: str | None = None) -> Decision:
    """The queued row's decision: placed (over its window), pending with the plan's reason, or pending
    with ``QuotaExceeded`` when the charge was refused."""
    if entry is None:
        return Decision(row.id, "pending", no_fit_conditions(reason or ""))
    if entry.refused is not None:
        return Decision(row.id, "pending", quota_exceeded_conditions(entry.refused.message))
    if isinstance(entry.outcome, Placed):
        return Decision(row.id, "placed", entry.conditions, entry.request.end)
    assert isinstance(entry.outcome, Pending)
    return Decision(row.id, "pending", no_fit_conditions(entry.outcome.reason, entry.outcome.why))


async def work_batch(
    engine: AsyncEngine, cache: PoolCache, config: CapacityConfig, pool_id: str, warm: WarmSlot | None = None
) -> int:
    """Claim and decide up to ``config.max_batch`` queued reservations of ``pool_id`` in one
    transaction; returns how many were claimed (0: none claimable). ``warm``: the pool's reads kept
    from the caller's previous batch (:class:`~app.capacity.planning.shared_reads.WarmReads`), left for the
    next."""
    return (await _work_batch(engine, cache, config, pool_id, warm))[0]


async def _work_batch(
    engine: AsyncEngine, cache: PoolCache, config: CapacityConfig, pool_id: str, warm: WarmSlot | None = None
) -> tuple[int, int]:
    """:func:`work_batch`: ``(claimed, left)``, ``left`` the pool's queued rows the claim saw and did
    not take. One transaction: BEGIN, the claim (:func:`_claim`), the batch's plans and commits
    (:func:`app.capacity.placing.batch.place_batch`, on ``warm``'s reads where usable), the decisions written
    with the ``bc_decided`` that carries their views in one statement (:func:`decide`), COMMIT; the
    warm reads are dropped when the transaction does not commit."""
    tokens: list[int] = []
    planning = False  # place_batch ran: its warm reads hold only once the transaction committed
    try:
        async with engine.begin() as conn:
            claim = await _claim(conn, pool_id, config.max_batch)
            rows, now = claim.rows, claim.now
            if not rows:
                return 0, claim.left
            entries: dict[str, BatchEntry] = {}
            passed: dict[str, str] = {}  # too late to place: pending with this reason, the end task ends it
            for row in rows:
                body = ReservationRequest.model_validate({**row.spec, "idempotencyKey": row.idempotency_key})
                if body.fixed_start is not None and body.fixed_start <= now:
                    passed[row.id] = START_PASSED_WHILE_QUEUED
                    continue
                request = placement_request(config, body, now)
                assert request.start is not None
                if deadline_passed(row.deadline, request.start):
                    passed[row.id] = DEADLINE_PASSED_WHILE_QUEUED
                    continue
                entries[row.id] = BatchEntry(row.id, request, quota_amounts(request))
            opts = batch_options(config)
            planning = True
            tokens = await place_batch(conn, cache, opts, pool_id, list(entries.values()), warm)
            decisions = [_decision(entries.get(r.id), r, passed.get(r.id)) for r in rows]
            views = [decided_view(r, d, entries.get(r.id)) for r, d in zip(rows, decisions, strict=True)]
            await decide(conn, decisions, views)
            _observe(rows, decisions, now)
        planning = False  # committed
        return len(rows), claim.left
    finally:  # committed or rolled back: the bookings (or their absence) are visible to every plan
        if warm is not None and planning:
            warm.reads = None
        for token in tokens:
            cache.forget(pool_id, token)


def _observe(rows: list[Any], decisions: list[Decision], now: Any) -> None:
    PLACEMENT_BATCH_SIZE.labels(POOL_LEASE).observe(len(rows))
    count_batch_attempts(POOL_LEASE, [d.status for d in decisions])
    for row, d in zip(rows, decisions, strict=True):
        QUEUED_DECIDED.labels(d.status).inc()
        QUEUED_WAIT.observe(max((now - row.created_at).total_seconds(), 0.0))


def _decide_statement() -> Prepared:
    # WITH decided_rows AS (UPDATE reservations ... FROM unnest(:ids, ...) d WHERE id = d.id)
    # SELECT pg_notify('bc_decided', payload) FROM unnest(:payloads) AS payload
    written = decided_update().returning(reservations.c.id).cte("decided_rows")
    payload = sa.func.unnest(sa.bindparam("payloads", type_=ARRAY(sa.Text))).column_valued("payload")
    return Prepared(sa.select(sa.func.pg_notify(DECIDED_CHANNEL, payload)).add_cte(written))


DECIDE = _decide_statement()


async def decide(conn: AsyncConnection, decisions: list[Decision], views: list[Reservation]) -> None:
    """Write the decisions and send ``bc_decided`` carrying ``views`` (delivered at COMMIT) in one
    statement (:data:`DECIDE`, prepared; a data-modifying CTE runs whether or not it is read), as many
    notifications as NOTIFY's 8000-byte payload limit needs (:func:`decided_payloads`)."""
    if decisions:
        await DECIDE.run(conn, {**decided_params(decisions), "payloads": decided_payloads(views)})


async def pools_with_queued(conn: AsyncConnection, pool_id: str | None = None) -> list[str]:
    """The pools that have queued reservations (plain read: rows other workers hold count too)."""
    # SELECT DISTINCT pool_id FROM reservations WHERE status = 'queued' [AND pool_id = :pool]
    stmt = sa.select(reservations.c.pool_id).where(IS_QUEUED).distinct()
    if pool_id is not None:
        stmt = stmt.where(reservations.c.pool_id == pool_id)
    return list((await conn.execute(stmt.order_by(reservations.c.pool_id))).scalars())


# ------------------------------------------------------------------------------------ the worker


@dataclass(eq=False, slots=True)
class _Waiter:
    """One long-poll: set when a ``bc_decided`` line names its reservation, with the view it carried
    (None: a bare id, read it)."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    view: Reservation | None = None


class QueueWorker(ListeningController[str]):
    """The batch worker of one service process: :meth:`listen` (LISTEN on the queue and decided
    channels) and :meth:`run` (decide the queued work of the pools heard about); ``poke`` starts a run
    now (set once the lifecycle exists). Also the in-process hub of long-polls (:meth:`wait`)."""

    @functools.cached_property
    def _warm(self) -> dict[str, WarmSlot]:
        """Pool id -> the reads kept from this worker's last committed batch of the pool."""
        return defaultdict(WarmSlot)

    @functools.cached_property
    def _watchers(self) -> dict[str, set[_Waiter]]:
        """Reservation id -> the long-polls waiting on it."""
        return defaultdict(set)

    def channels(self) -> Mapping[str, Callable[[str], None]]:
        return {QUEUE_CHANNEL: self.heard_queue, DECIDED_CHANNEL: self.heard_decided}

    def heard_queue(self, pool_id: str) -> None:
        """A queue edge of ``pool_id``: remember it and start a run."""
        self._heard.add(pool_id)
        self.poke()

    def heard_decided(self, payload: str) -> None:
        """A ``bc_decided`` payload: wake the long-polls of the reservations it names, and only those,
        each with the view the line carries (parsed only for a reservation someone waits on)."""
        if not self._watchers:
            return
        for rid, text in parse_decided(payload):
            waiters = self._watchers.get(rid)
            if not waiters:
                continue
            view = read_view_json(text) if text else None
            for waiter in waiters:
                waiter.view = view
                waiter.event.set()

    def waiting(self, reservation_id: str) -> int:
        """How many long-polls of this process wait on ``reservation_id`` (tests)."""
        return len(self._watchers.get(reservation_id, ()))

    async def run(self, engine: AsyncEngine) -> int:
        """One run: each pool heard about (every pool with queued work when the sweep is due), batch
        after batch while a batch takes ``maxBatch``; returns how many reservations were decided here.
        Queued rows the last claim saw but could not take (another worker holds them) are looked at
        again after ``BUSY_RETRY`` seconds: when that worker dies, this one takes them."""
        targets, self._heard = self._heard, set()
        if self.sweep_due():
            async with engine.connect() as conn:
                targets |= set(await pools_with_queued(conn))
        decided = 0
        busy = False
        for pool_id in sorted(targets):
            while True:
                warm = self._warm[pool_id]
                claimed, left = await _work_batch(engine, self.cache, self.config, pool_id, warm)
                decided += claimed
                if claimed < self.config.max_batch:
                    break
            if left > 0:  # held by another worker: look again soon
                self._heard.add(pool_id)
                busy = True
        if busy:
            asyncio.get_running_loop().call_later(BUSY_RETRY, self.poke)
        return decided

    async def wait(
        self, engine: AsyncEngine, principal: Principal, reservation_id: str, seconds: int, action: str = READ
    ) -> Reservation:
        """``GET /v1/reservations/{id}?waitSeconds=N``: the reservation view once it is no longer
        ``queued``, or after ``seconds`` (0..30) as it is then. Raises NotFound (absent, or another
        tenant's than a tenant-scoped principal's) and Forbidden (``action`` not granted on
        ``tenant:<owner>``), as :func:`~app.capacity.reservations.access.authorized_reservation_tenant`.

        Round trips: one statement on an autocommit connection (the view, authorized on the owner it
        names); woken by the ``bc_decided`` line of this reservation alone, it answers the view the
        line carries without a read (a bare id: one read). Re-read at least every ``RECHECK_SECONDS``
        (a release sends no decided edge). Holds no connection while waiting."""
        waiter = _Waiter()
        self._watchers[reservation_id].add(waiter)  # before the read: a decision after it wakes us
        deadline = asyncio.get_running_loop().time() + seconds
        try:
            view = await _read_view(engine, reservation_id)
            authorize_owned(
                principal, action, view.tenantId if view else None, reservation_named(reservation_id)
            )
            assert view is not None
            while view.status == ReservationStatus.queued:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(remaining, RECHECK_SECONDS)):
                        await waiter.event.wait()
                carried, waiter.view = waiter.view, None
                waiter.event.clear()
                fresh = carried if carried is not None else await _read_view(engine, reservation_id)
                if fresh is None:  # gone (never, today): as if it had never been there
                    raise reservation_not_found(reservation_id)
                view = fresh
            return view
        finally:
            waiters = self._watchers.get(reservation_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._watchers[reservation_id]


async def _read_view(engine: AsyncEngine, reservation_id: str) -> Reservation | None:
    """:func:`~app.capacity.views.read_view` as one round trip: autocommit spares BEGIN and
    ROLLBACK."""
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        return await read_view(conn, reservation_id)
