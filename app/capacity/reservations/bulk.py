"""Bulk create: ``POST /v1/reservations/batch {items: [ReservationRequest, ...]}`` (docs/api.md,
docs/scaling.md), with either placer.

Each item is independent: its own idempotency key, authorization (checked by the route before this is
called) and quota; one item's error does not fail the others, and nothing is changed for an item that
fails. The plain items are written, planned and committed like a pool-lease batch, in one transaction
per call (pools in id order, :func:`app.capacity.placing.batch.place_batch`), after the whole body was
read and before any answer is written: no lock is held while waiting for HTTP. Gangs, whole-node
leases and ``start: "earliest"`` items (their window is searched first, docs/lifecycle.md, "Earliest
start") are created inline, one transaction each, after the batch.

Per item the answer is an :class:`ItemResult` ``(status, Reservation | None, error | None)``: 201
created (placed or pending), 200 an idempotent retry, else the error's status (404 pool, 409
QUOTA_EXCEEDED / IDEMPOTENCY_KEY_REUSED, 422 ``start``) with its body.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.answers.reservations import Reservation
from app.capacity.commit.lost_races import ATOM_BOOKED, LOST_RACE_SQLSTATES
from app.capacity.conditions import no_fit_conditions
from app.capacity.config import CapacityConfig
from app.capacity.placing.batch import BatchEntry, batch_options, place_batch
from app.capacity.placing.inline import Pending, Placed, db_now
from app.capacity.placing.registry import must_place_inline
from app.capacity.planning.admission import admit
from app.capacity.planning.snapshot import PoolCache, PoolHead, read_pool_head
from app.capacity.queue.intake import Decision, Written, delete_unwritten, insert_reservations, mark_decided
from app.capacity.requests import check_start, placement_request, quota_amounts
from app.capacity.reservations.create import create_reservation
from app.capacity.views import committed_view, reservation_view, row_view, with_warnings
from app.db.locks import wait_for_pool_lease
from app.db.tx import sqlstate
from app.errors import AppError, InvalidInput
from app.observability.metrics import LOST_RACES, PLACEMENT_BATCH_SIZE, count_batch_attempts
from app.placement.request import ReservationRequest

MAX_ITEMS = 256
BULK = "bulk"


@dataclass(frozen=True, slots=True)
class ItemResult:
    """One item's answer: its HTTP ``status`` and the reservation view or the error."""

    status: int
    reservation: Reservation | None = None
    error: AppError | None = None


def failed(error: AppError) -> ItemResult:
    """The answer of an item that failed with ``error`` (nothing was written for it)."""
    return ItemResult(error.status, error=error)


async def create_batch(
    engine: AsyncEngine,
    cache: PoolCache,
    config: CapacityConfig,
    items: list[ReservationRequest | ItemResult],
) -> list[ItemResult]:
    """Create every ``ReservationRequest`` of ``items`` (an :class:`ItemResult` is an item the route
    already refused: kept as it is); the answers in the items' order."""
    out: dict[int, ItemResult] = {i: it for i, it in enumerate(items) if isinstance(it, ItemResult)}
    plain = {
        i: it
        for i, it in enumerate(items)
        if isinstance(it, ReservationRequest) and not must_place_inline(it)
    }
    if plain:
        out.update(await _batch_transaction(engine, cache, config, plain))
    for i, it in enumerate(items):
        if isinstance(it, ReservationRequest) and i not in plain:
            try:
                view, created = await create_reservation(engine, cache, config, it)
                out[i] = ItemResult(201 if created else 200, view)
            except AppError as exc:
                out[i] = failed(exc)
    return [out[i] for i in range(len(items))]


TRANSACTION_ATTEMPTS = 3  # a deadlock the batch's savepoints did not absorb: run the whole call again


async def _batch_transaction(
    engine: AsyncEngine, cache: PoolCache, config: CapacityConfig, plain: dict[int, ReservationRequest]
) -> dict[int, ItemResult]:
    """The plain items in one transaction. A deadlock (40P01) or exclusion violation (23P01) outside
    the guarded statements' savepoints (a cordon or Hello taking a node the batch holds) is a lost
    race of the whole call: it is rolled back (nothing written) and run again, up to
    :data:`TRANSACTION_ATTEMPTS` times; the last one raises."""
    for attempt in range(1, TRANSACTION_ATTEMPTS + 1):
        tokens: list[tuple[str, int]] = []
        try:
            async with engine.begin() as conn:
                return await _batch(conn, cache, config, plain, tokens)
        except DBAPIError as exc:
            if sqlstate(exc) not in LOST_RACE_SQLSTATES or attempt == TRANSACTION_ATTEMPTS:
                raise
            LOST_RACES.labels(ATOM_BOOKED).inc()
        finally:  # committed or rolled back: the bookings are visible to every plan now
            for pool_id, token in tokens:
                cache.forget(pool_id, token)
    raise AssertionError("unreachable")


async def _batch(
    conn: AsyncConnection,
    cache: PoolCache,
    config: CapacityConfig,
    plain: dict[int, ReservationRequest],
    tokens: list[tuple[str, int]],
) -> dict[int, ItemResult]:
    """Write, check, charge, plan and commit the plain items in ``conn``'s transaction."""
    order = sorted(plain)
    written = dict(zip(order, await insert_reservations(conn, [plain[i] for i in order]), strict=True))
    now = await db_now(conn)
    out: dict[int, ItemResult] = {}
    new: dict[int, BatchEntry] = {}
    unwritten: list[str] = []
    bad_start: dict[str, AppError] = {}  # rows removed again because their start or intake was refused
    heads: dict[str, PoolHead] = {}
    warned: dict[int, tuple[str, ...]] = {}  # intake's warnings per item
    for i in order:
        w = written[i]
        if w.error is not None:
            out[i] = failed(w.error)
        elif w.created:
            try:
                check_start(plain[i], now, config.max_lead)
            except AppError as error:
                exc = error.under(f"items.{i}") if isinstance(error, InvalidInput) else error
                out[i] = failed(exc)
                unwritten.append(w.row.id)
                bad_start[w.row.id] = exc
                continue
            request = placement_request(config, plain[i], now)
            assert not must_place_inline(request)
            if request.pool_id not in heads:  # one indexed read per pool; the inventory is cached
                heads[request.pool_id] = await read_pool_head(conn, request.pool_id)
            try:
                warned[i] = await admit(conn, cache, heads[request.pool_id], request)
            except AppError as error:  # INVALID_INPUT at the item's field, or UNSATISFIABLE
                exc = error.under(f"items.{i}") if isinstance(error, InvalidInput) else error
                out[i] = failed(exc)
                unwritten.append(w.row.id)
                bad_start[w.row.id] = exc
                continue
            new[i] = BatchEntry(w.row.id, request, quota_amounts(request))
    by_pool: dict[str, list[BatchEntry]] = defaultdict(list)
    for entry in new.values():
        by_pool[entry.request.pool_id].append(entry)
    opts = batch_options(config)
    for pool_id in sorted(by_pool):  # pools in id order: two calls lock them alike
        # one batch at a time plans a pool, on every replica: without the lease two replicas' batches
        # plan the same atoms, and each waits on the other's bookings and scalar rows (bulk at 16
        # clients on 2 processes: 74 placements/s, calls of 54 s, against about 1,000/s on one)
        await wait_for_pool_lease(conn, pool_id)
        PLACEMENT_BATCH_SIZE.labels(BULK).observe(len(by_pool[pool_id]))
        tokens += [(pool_id, t) for t in await place_batch(conn, cache, opts, pool_id, by_pool[pool_id])]
    for i, entry in new.items():
        if entry.refused is not None:
            out[i] = failed(entry.refused)
            unwritten.append(entry.reservation_id)
    decisions = [_decision(e) for e in new.values() if e.refused is None]
    count_batch_attempts(BULK, [d.status for d in decisions])
    rows = await mark_decided(conn, decisions)
    await delete_unwritten(conn, unwritten)
    for i, entry in new.items():
        if entry.refused is None:
            out[i] = ItemResult(
                201, with_warnings(_placed_view(rows[entry.reservation_id], entry), warned[i])
            )
    for i in order:  # idempotent retries (of earlier calls, or of an earlier item of this call)
        if i not in out:
            refused = bad_start.get(written[i].row.id)
            out[i] = failed(refused) if refused else await _retry_answer(conn, written[i], new, rows)
    return out


def _decision(entry: BatchEntry) -> Decision:
    if isinstance(entry.outcome, Placed):
        return Decision(entry.reservation_id, "placed", entry.conditions, entry.request.end)
    assert isinstance(entry.outcome, Pending)
    return Decision(
        entry.reservation_id, "pending", no_fit_conditions(entry.outcome.reason, entry.outcome.why)
    )


def _placed_view(row: Any, entry: BatchEntry) -> Reservation:
    allocs = (
        [committed_view(a, entry.request) for a in entry.outcome.allocations]
        if isinstance(entry.outcome, Placed)
        else []
    )
    return row_view(row, allocs)


async def _retry_answer(
    conn: AsyncConnection, w: Written, new: dict[int, BatchEntry], rows: dict[str, Any]
) -> ItemResult:
    """200 with the reservation made before: by an earlier call, or by an earlier item of this call
    (then as this call decided it; an earlier item that failed leaves this one failed alike)."""
    for entry in new.values():
        if entry.reservation_id == w.row.id:
            if entry.refused is not None:
                return failed(entry.refused)
            return ItemResult(200, _placed_view(rows[entry.reservation_id], entry))
    return ItemResult(200, await reservation_view(conn, w.row))
