"""Reservations service: create (idempotent), get, list, release, and preview (seed 000).

create: one transaction. The reservation row is inserted first with ``ON CONFLICT (tenant_id,
idempotency_key) DO NOTHING``: concurrent creates with one key queue on that index entry, and the
losers read the winner's row (same body -> the same reservation; another body -> 409
IDEMPOTENCY_KEY_REUSED). Then the inline placer plans on plain reads, quota is charged (guarded UPDATE,
409 QUOTA_EXCEEDED rolls everything back) right before the pool lock, and the plan is committed; the
quota row is held for the commit, not for the plan. A request that cannot be placed is stored ``pending``
with its Unschedulable condition (reason ``NoFit``) and its quota is refunded in the same transaction:
quota holdings always equal the tenant's placed reservations, each over its window.

Time (DESIGN.md, "Reservation lifecycle"): bookings, scalar holdings and quota are held over the
reservation's window only, so a placed reservation stops counting at its end by itself; the lifecycle
controller then moves it to ``ended`` (:func:`end_reservations`). ``start`` is at most ``max_lead``
ahead of the database clock.

release: locks the reservation row, cuts its quota holdings first, then its bookings and scalar holdings,
at the release instant: what had not started is removed, what had is kept as history up to that instant
(lock order quota_usage -> pools -> nodes -> devices -> node_resources -> pool_capacity_rollup).
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.capacity.access import reservation_not_found, visible
from app.capacity.commit import Committed, sqlstate
from app.capacity.conditions import NO_FIT, ended_condition, unschedulable_condition, window_passed_condition
from app.capacity.edges import notify_pool
from app.capacity.placer import Pending, Placed, db_now, place_inline
from app.capacity.shortlist import plan_request
from app.capacity.snapshot import PoolCache
from app.db.locks import lock_pool
from app.db.tables import TS, allocations, device_bookings, reservations, scalar_holdings
from app.db.tx import reads
from app.db.windows import cut
from app.errors import IdempotencyKeyReused, InvalidInput, NotFound, quote_input
from app.ids import new_id
from app.jsonnum import num
from app.placement.model import PlacementRequest, Plan
from app.placement.options import SchedulerOptions
from app.placement.request import ReservationRequest, to_placement_request
from app.placement.summary import ARCHIVED_POOL
from app.quota import service as quota

PREVIEW_CANDIDATES = 10
START_SKEW = timedelta(seconds=60)  # a start this far behind the database clock is still "now"
MAX_LEAD = timedelta(days=366)  # BC_CAPACITY_MAX_LEAD: how far ahead a window may start
END_BATCH = 100  # reservations ended per statement of the lifecycle sweep
FOREIGN_KEY_VIOLATION = "23503"


@dataclass(frozen=True, slots=True)
class CapacityConfig:
    """What the capacity service needs from settings: scheduler options and ``max_attempts``."""

    options: SchedulerOptions
    max_attempts: int = 3
    shortlist_min: int = 48
    # BC_CAPACITY_ENFORCE_DEVICE_LIMITS: host resources need bc.dev/cap.devices.limits (requiredCapabilities)
    enforce_device_limits: bool = False
    max_lead: timedelta = MAX_LEAD


def placement_request(
    config: CapacityConfig,
    body: ReservationRequest,
    now: datetime,
    node_labels: Mapping[str, str] | None = None,
) -> PlacementRequest:
    """The capacity port's entry point from a reservation body to a PlacementRequest: a module's
    ``node_labels`` plus capacity's requiredCapabilities under ``config`` (create, preview, and the
    re-place / repair paths all build their request here)."""
    return to_placement_request(
        body, now, enforce_device_limits=config.enforce_device_limits, node_labels=node_labels
    )


def spec_hash(spec: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a reservation spec (idempotent retries compare it)."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def quota_amounts(request: PlacementRequest) -> dict[str, Decimal]:
    """What a request charges: atoms per device class and scalar amounts, times gang members."""
    members = request.gang.members if request.gang else 1
    amounts: dict[str, Decimal] = defaultdict(Decimal)
    for d in request.devices:
        amounts[d.device_class] += Decimal(d.count * members)
    for name, n in request.resources.items():
        amounts[name] += Decimal(n) * members
    return dict(amounts)


def check_start(body: ReservationRequest, now: datetime, max_lead: timedelta = MAX_LEAD) -> None:
    """Raise InvalidInput (path ``start``) for a window that starts in the past (more than 60 s behind
    the database clock, to allow for client clock skew) or more than ``max_lead`` ahead of it."""
    if body.start is None:
        return
    if body.start < now - START_SKEW:
        raise InvalidInput(
            f"start {body.start.isoformat()} is in the past (now {now.isoformat()})", path="start"
        )
    if body.start > now + max_lead:
        raise InvalidInput(
            f"start {body.start.isoformat()} is more than {max_lead.days} days ahead "
            f"(now {now.isoformat()}, at most {(now + max_lead).isoformat()})",
            path="start",
        )


def _condition(reason: str) -> list[dict[str, Any]]:
    return [unschedulable_condition(NO_FIT, reason)]


async def create_reservation(
    engine: AsyncEngine, cache: PoolCache, config: CapacityConfig, body: ReservationRequest
) -> tuple[dict[str, Any], bool]:
    """Create (or find, for an idempotent retry) a reservation; returns ``(view, created)``.

    Raises NotFound (pool), QuotaExceeded, IdempotencyKeyReused; on any error nothing is written.
    """
    spec = body.spec()
    digest = spec_hash(spec)
    assumptions: list[int] = []
    try:
        return await _create(engine, cache, config, body, spec, digest, assumptions)
    finally:  # committed or rolled back: the bookings (or their absence) are visible to every plan now
        for token in assumptions:
            cache.forget(body.poolId, token)


async def _create(
    engine: AsyncEngine,
    cache: PoolCache,
    config: CapacityConfig,
    body: ReservationRequest,
    spec: dict[str, Any],
    digest: str,
    assumptions: list[int],
) -> tuple[dict[str, Any], bool]:
    async with engine.begin() as conn:
        reservation_id = new_id("res")
        try:
            # INSERT INTO reservations (...) VALUES (...) ON CONFLICT (tenant_id, idempotency_key)
            #   DO NOTHING RETURNING created_at          -- no row: the key was used (or is being used)
            inserted = (
                await conn.execute(
                    pg_insert(reservations)
                    .values(
                        id=reservation_id,
                        tenant_id=body.tenantId,
                        pool_id=body.poolId,
                        status="pending",
                        spec=spec,
                        spec_hash=digest,
                        idempotency_key=body.idempotencyKey,
                    )
                    .on_conflict_do_nothing(index_elements=["tenant_id", "idempotency_key"])
                    .returning(reservations.c.created_at)
                )
            ).first()
        except IntegrityError as exc:  # the pool foreign key: no such pool, and nothing was written
            if sqlstate(exc) == FOREIGN_KEY_VIOLATION:
                raise NotFound(f"pool {quote_input(body.poolId)} not found") from None
            raise
        if inserted is None:
            existing = (
                await conn.execute(
                    sa.select(reservations).where(
                        reservations.c.tenant_id == body.tenantId,
                        reservations.c.idempotency_key == body.idempotencyKey,
                    )
                )
            ).first()
            assert existing is not None
            if existing.spec_hash != digest:
                raise IdempotencyKeyReused(
                    f"idempotency key {body.idempotencyKey} was used with another body",
                    {"idempotencyKey": body.idempotencyKey, "reservationId": existing.id},
                )
            return await _view(conn, existing), False

        now = inserted.created_at  # the database's now()
        check_start(body, now, config.max_lead)  # raising rolls the reservation row back: nothing is written
        request = placement_request(config, body, now)
        assert request.start is not None and request.end is not None
        amounts = quota_amounts(request)
        charged = False

        async def charge() -> None:
            nonlocal charged
            assert request.start is not None and request.end is not None
            await quota.charge(
                conn, body.tenantId, body.poolId, reservation_id, amounts, request.start, request.end
            )
            charged = True

        outcome = await place_inline(
            conn,
            cache,
            request,
            reservation_id,
            config.options,
            config.max_attempts,
            config.shortlist_min,
            before_lock=charge,
        )
        if isinstance(outcome, Placed):
            assumptions.extend(outcome.assumptions)
            status, conditions = "placed", []
        else:
            assert isinstance(outcome, Pending)
            if not charged:  # over quota is 409 even when nothing fits; a pending request holds nothing
                await charge()
            await quota.refund(conn, reservation_id)
            status, conditions = "pending", _condition(outcome.reason)
        row = (
            await conn.execute(
                sa.update(reservations)
                .where(reservations.c.id == reservation_id)
                .values(
                    status=status,
                    conditions=conditions,
                    updated_at=sa.func.now(),
                    ends_at=request.end if status == "placed" else None,
                )
                .returning(*reservations.c)
            )
        ).one()
        allocs = (
            [_committed_view(a, request) for a in outcome.allocations] if isinstance(outcome, Placed) else []
        )
        return _shape(row, allocs), True


def _committed_view(a: Committed, request: PlacementRequest) -> dict[str, Any]:
    """The view of an allocation just written (what :func:`_allocations` would read back)."""
    assert request.start is not None and request.end is not None
    return {
        "id": a.allocation_id,
        "nodeId": a.node_id,
        "atoms": list(a.atoms),
        "resources": {k: num(Decimal(v)) for k, v in a.resources.items()},
        "start": request.start.isoformat(),
        "end": request.end.isoformat(),
        "releasedAt": None,
    }


async def _allocations(conn: AsyncConnection, reservation_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if not reservation_ids:
        return out
    rows = (
        await conn.execute(
            sa.select(allocations)
            .where(allocations.c.reservation_id.in_(reservation_ids))
            .order_by(allocations.c.created_at, allocations.c.id)
        )
    ).all()
    for a in rows:
        out[a.reservation_id].append(
            {
                "id": a.id,
                "nodeId": a.node_id,
                "atoms": list(a.atoms),
                "resources": {k: num(Decimal(v)) for k, v in (a.resources or {}).items()},
                "start": a.during.lower.isoformat(),
                "end": a.during.upper.isoformat(),
                "releasedAt": a.released_at.isoformat() if a.released_at else None,
            }
        )
    return out


def _shape(row: Any, allocs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": row.id,
        "tenantId": row.tenant_id,
        "poolId": row.pool_id,
        "status": row.status,
        "idempotencyKey": row.idempotency_key,
        "spec": row.spec,
        "allocations": allocs,
        "conditions": row.conditions or [],
        "createdAt": row.created_at.isoformat(),
        "releasedAt": row.released_at.isoformat() if row.released_at else None,
    }


async def _view(conn: AsyncConnection, row: Any) -> dict[str, Any]:
    allocs = await _allocations(conn, [row.id])
    return _shape(row, allocs.get(row.id, []))


@reads
async def get_reservation(
    conn: AsyncConnection, reservation_id: str, tenant_id: str | None
) -> dict[str, Any]:
    """The reservation view; another tenant's reservation (``tenant_id`` set) is NotFound, not 403."""
    row = (await conn.execute(sa.select(reservations).where(reservations.c.id == reservation_id))).first()
    if not visible(row, tenant_id):
        raise reservation_not_found(reservation_id)
    return await _view(conn, row)


@reads
async def list_reservations(
    conn: AsyncConnection,
    tenant_id: str | None,
    status: str | None,
    limit: int = 100,
    after: tuple[datetime, str] | None = None,
) -> dict[str, Any]:
    """A page of reservations newest first (``created_at`` then id, descending), filtered by tenant and
    status, after the key ``(createdAt, id)`` of the previous page's last item: ``{items, next}`` where
    ``next`` is the last item's ``(createdAt, id)`` when more remain, else None."""
    # SELECT * FROM reservations WHERE [tenant_id = :t] [AND status = :s] [AND (created_at, id) < (:c, :id)]
    #   ORDER BY created_at DESC, id DESC LIMIT :limit + 1
    stmt = (
        sa.select(reservations)
        .order_by(reservations.c.created_at.desc(), reservations.c.id.desc())
        .limit(limit + 1)
    )
    if tenant_id is not None:
        stmt = stmt.where(reservations.c.tenant_id == tenant_id)
    if status is not None:
        stmt = stmt.where(reservations.c.status == status)
    if after is not None:
        stmt = stmt.where(sa.tuple_(reservations.c.created_at, reservations.c.id) < sa.tuple_(*after))
    rows = (await conn.execute(stmt)).all()
    page, more = rows[:limit], len(rows) > limit
    allocs = await _allocations(conn, [r.id for r in page])
    items = [_shape(r, allocs.get(r.id, [])) for r in page]
    return {"items": items, "next": (items[-1]["createdAt"], items[-1]["id"]) if more else None}


async def reservation_tenant(conn: AsyncConnection, reservation_id: str) -> tuple[str, str] | None:
    """``(tenant_id, pool_id)`` of a reservation, or None (for authorization before the service call)."""
    row = (
        await conn.execute(
            sa.select(reservations.c.tenant_id, reservations.c.pool_id).where(
                reservations.c.id == reservation_id
            )
        )
    ).first()
    return (row.tenant_id, row.pool_id) if row else None


async def release_reservation(
    engine: AsyncEngine, reservation_id: str, tenant_id: str | None, now: datetime | None = None
) -> dict[str, Any]:
    """Release a reservation at ``now`` (default: the database clock): its quota holdings, bookings and
    scalar holdings are cut at that instant (removed when the window had not started), its allocations
    keep ``start``, ``end`` and get ``releasedAt``. Releasing twice, or releasing an ended or preempted
    reservation, is a no-op that answers the reservation. Another tenant's reservation is NotFound."""
    async with engine.begin() as conn:
        row = (
            await conn.execute(
                sa.select(reservations).where(reservations.c.id == reservation_id).with_for_update()
            )
        ).first()
        if not visible(row, tenant_id):
            raise reservation_not_found(reservation_id)
        if row.status in ("released", "preempted", "ended"):
            return await _view(conn, row)
        at = now if now is not None else await db_now(conn)
        if row.status == "placed":
            await quota.cut_holdings(conn, row.id, at)  # quota first (lock order)
            await free_allocations(conn, await _live_allocations(conn, row.id), row.pool_id, at)
            await notify_pool(conn, row.pool_id)  # wake edge: a release
        await conn.execute(
            sa.update(reservations)
            .where(reservations.c.id == reservation_id)
            .values(status="released", released_at=at, updated_at=sa.func.now())
        )
        row = (await conn.execute(sa.select(reservations).where(reservations.c.id == reservation_id))).one()
        return await _view(conn, row)


async def _live_allocations(conn: AsyncConnection, reservation_id: str) -> list[Any]:
    return list(
        (
            await conn.execute(
                sa.select(allocations)
                .where(allocations.c.reservation_id == reservation_id, allocations.c.released_at.is_(None))
                .order_by(allocations.c.node_id)
            )
        ).all()
    )


async def free_allocations(conn: AsyncConnection, live: list[Any], pool_id: str, at: datetime) -> None:
    """Cut live allocations at ``at``: their bookings and scalar holdings end there (or are removed when
    they had not started), and the allocations get ``released_at`` (lock order pools -> ... ->
    node_resources). Cutting only shrinks what is held, so it takes no node_resources lock: a guard
    that read the longer holding meanwhile was only more careful than it had to be."""
    if not live:
        return
    await lock_pool(conn, pool_id, for_update=False)
    ids = [a.id for a in live]
    # DELETE FROM device_bookings WHERE allocation_id = ANY(:ids) AND lower(during) >= :at;
    # UPDATE device_bookings SET during = tstzrange(lower(during), :at, '[)')
    #  WHERE allocation_id = ANY(:ids) AND during @> :at;
    await conn.execute(
        sa.delete(device_bookings).where(
            device_bookings.c.allocation_id.in_(ids), sa.func.lower(device_bookings.c.during) >= at
        )
    )
    await conn.execute(
        sa.update(device_bookings)
        .where(
            device_bookings.c.allocation_id.in_(ids), device_bookings.c.during.op("@>")(sa.literal(at, TS))
        )
        .values(during=sa.func.tstzrange(sa.func.lower(device_bookings.c.during), at, "[)"))
    )
    await cut(conn, scalar_holdings, [scalar_holdings.c.allocation_id.in_(ids)], at)
    await conn.execute(sa.update(allocations).where(allocations.c.id.in_(ids)).values(released_at=at))


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
        due = (
            await conn.execute(
                sa.select(
                    reservations.c.id,
                    reservations.c.pool_id,
                    reservations.c.ends_at,
                    reservations.c.conditions,
                )
                .where(reservations.c.status == "placed", reservations.c.ends_at <= at)
                .order_by(reservations.c.ends_at)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
        ).all()
        await _mark_ended(conn, [(r.id, r.conditions, ended_condition(r.ends_at)) for r in due])
        for pool_id in sorted({r.pool_id for r in due}):
            await notify_pool(conn, pool_id)  # wake edge: an end (what was held stopped counting)
    return [r.id for r in due]


async def end_passed_windows(
    engine: AsyncEngine, now: datetime | None = None, limit: int = END_BATCH
) -> list[str]:
    """Move pending reservations with an explicit ``start`` at or before ``now`` (default: the database
    clock) to ``ended`` with the condition ``Ended`` / ``WindowPassed``; returns their ids, oldest start
    first. A pending reservation holds nothing, so nothing is freed. Replica-safe as
    :func:`end_reservations` (``FOR UPDATE SKIP LOCKED``, then ``status = 'pending'`` re-checked)."""
    start = sa.cast(reservations.c.spec["start"].astext, TS)
    async with engine.begin() as conn:
        at = now if now is not None else await db_now(conn)
        # SELECT id, (spec->>'start')::timestamptz AS start, conditions FROM reservations
        #  WHERE status = 'pending' AND spec->>'start' IS NOT NULL AND (spec->>'start')::timestamptz <= :now
        #  ORDER BY 2 LIMIT :limit FOR UPDATE SKIP LOCKED
        due = (
            await conn.execute(
                sa.select(reservations.c.id, start.label("start"), reservations.c.conditions)
                .where(
                    reservations.c.status == "pending",
                    reservations.c.spec["start"].astext.is_not(None),
                    start <= at,
                )
                .order_by(start)
                .limit(limit)
                .with_for_update(of=reservations, skip_locked=True)
            )
        ).all()
        await _mark_ended(conn, [(r.id, r.conditions, window_passed_condition(r.start)) for r in due])
    return [r.id for r in due]


async def _mark_ended(
    conn: AsyncConnection, rows: list[tuple[str, list[dict[str, Any]] | None, dict[str, Any]]]
) -> None:
    """Set each claimed ``(id, conditions, ended condition)`` reservation ``ended``, the condition added."""
    for reservation_id, conditions, ended in rows:
        await conn.execute(
            sa.update(reservations)
            .where(reservations.c.id == reservation_id)
            .values(status="ended", conditions=[*(conditions or []), ended], updated_at=sa.func.now())
        )


async def preview(
    engine: AsyncEngine, cache: PoolCache, config: CapacityConfig, body: ReservationRequest
) -> dict[str, Any]:
    """The pipeline without the commit: ``{fits, candidates: [{nodeId, atoms, score, scores}], reason?}``
    with up to 10 candidates, best first (for a gang: its members). Checks neither quota nor writes."""
    async with engine.connect() as conn:
        now = await db_now(conn)
        check_start(body, now, config.max_lead)
        request = placement_request(config, body, now)
        outcome = await plan_request(
            conn,
            cache,
            request,
            config.options,
            config.shortlist_min,
            max(config.options.top_n, PREVIEW_CANDIDATES),
        )
    if outcome.head.archived:
        return {"fits": False, "candidates": [], "reason": ARCHIVED_POOL}
    plan = outcome.plan
    if not isinstance(plan, Plan):
        return {"fits": False, "candidates": [], "reason": plan.summary}
    return {
        "fits": True,
        "candidates": [
            {
                "nodeId": c.node_id,
                "nodeName": c.node_name,
                "atoms": list(c.atoms),
                "score": round(c.score, 6),
                "scores": {k: round(v, 6) for k, v in c.scores.items()},
            }
            # a gang preview shows the members of the best gang (seed 000, "Previewing a placement")
            for c in (plan.members or plan.ranked[:PREVIEW_CANDIDATES])
        ],
    }
