"""Reservations service: create (idempotent), get, list, release, and preview (seed 000).

create: one transaction. The reservation row is inserted first with ``ON CONFLICT (tenant_id,
idempotency_key) DO NOTHING``: concurrent creates with one key queue on that index entry, and the
losers read the winner's row (same body -> the same reservation; another body -> 409
IDEMPOTENCY_KEY_REUSED). Then the inline placer plans on plain reads, quota is charged (guarded UPDATE,
409 QUOTA_EXCEEDED rolls everything back) right before the pool lock, and the plan is committed; the
quota row is held for the commit, not for the plan. A request that cannot be placed is stored ``pending``
with its Unschedulable condition (reason ``NoFit``) and its quota is refunded in the same transaction:
quota usage always equals the tenant's placed reservations.

release: locks the reservation row, refunds quota first, then frees bookings and scalars (lock order
quota_usage -> pools -> nodes -> devices -> node_resources -> pool_capacity_rollup).
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

from app.capacity.commit import Committed, apply_rollup_delta, sqlstate
from app.capacity.placer import Pending, Placed, db_now, place_inline
from app.capacity.shortlist import plan_request
from app.capacity.snapshot import PoolCache
from app.db.tables import allocations, device_bookings, devices, node_resources, reservations
from app.errors import IdempotencyKeyReused, InvalidInput, NotFound, quote_input
from app.ids import new_id
from app.inventory.service import lock_pool
from app.jsonnum import num
from app.placement.model import PlacementRequest, Plan
from app.placement.options import SchedulerOptions
from app.placement.request import ReservationRequest, to_placement_request
from app.quota import service as quota

PREVIEW_CANDIDATES = 10
START_SKEW = timedelta(seconds=60)  # a start this far behind the database clock is still "now"
FOREIGN_KEY_VIOLATION = "23503"


@dataclass(frozen=True, slots=True)
class CapacityConfig:
    """What the capacity service needs from settings: scheduler options and ``max_attempts``."""

    options: SchedulerOptions
    max_attempts: int = 3
    shortlist_min: int = 48
    # BC_CAPACITY_ENFORCE_DEVICE_LIMITS: host resources need bc.dev/cap.devices.limits (requiredCapabilities)
    enforce_device_limits: bool = False


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


def check_start(body: ReservationRequest, now: datetime) -> None:
    """Raise InvalidInput (path ``start``) for a window that starts in the past (more than 60 s behind
    the database clock, to allow for client clock skew)."""
    if body.start is not None and body.start < now - START_SKEW:
        raise InvalidInput(
            f"start {body.start.isoformat()} is in the past (now {now.isoformat()})", path="start"
        )


def _condition(reason: str) -> list[dict[str, Any]]:
    return [{"type": "Unschedulable", "status": "True", "reason": "NoFit", "message": reason}]


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
        check_start(body, now)  # raising rolls the reservation row back: nothing is written
        request = placement_request(config, body, now)
        amounts = quota_amounts(request)
        charged = False

        async def charge() -> None:
            nonlocal charged
            await quota.charge(conn, body.tenantId, body.poolId, amounts)
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
            await quota.refund(conn, body.tenantId, body.poolId, amounts)
            status, conditions = "pending", _condition(outcome.reason)
        row = (
            await conn.execute(
                sa.update(reservations)
                .where(reservations.c.id == reservation_id)
                .values(status=status, conditions=conditions, updated_at=sa.func.now())
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


async def get_reservation(
    conn: AsyncConnection, reservation_id: str, tenant_id: str | None
) -> dict[str, Any]:
    """The reservation view; another tenant's reservation (``tenant_id`` set) is NotFound, not 403."""
    row = (await conn.execute(sa.select(reservations).where(reservations.c.id == reservation_id))).first()
    if row is None or (tenant_id is not None and row.tenant_id != tenant_id):
        raise NotFound(f"reservation {quote_input(reservation_id)} not found")
    return await _view(conn, row)


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
    engine: AsyncEngine, reservation_id: str, tenant_id: str | None
) -> dict[str, Any]:
    """Release a reservation: refund quota, then free its bookings and scalars. Releasing twice is a
    no-op that answers the released reservation. Another tenant's reservation is NotFound."""
    async with engine.begin() as conn:
        row = (
            await conn.execute(
                sa.select(reservations).where(reservations.c.id == reservation_id).with_for_update()
            )
        ).first()
        if row is None or (tenant_id is not None and row.tenant_id != tenant_id):
            raise NotFound(f"reservation {quote_input(reservation_id)} not found")
        if row.status in ("released", "preempted"):
            return await _view(conn, row)
        if row.status == "placed":
            live = await _live_allocations(conn, row.id)
            held = await _held_amounts(conn, live)
            await quota.refund(conn, row.tenant_id, row.pool_id, held)  # quota first (lock order)
            await free_allocations(conn, live, row.pool_id, held)
        await conn.execute(
            sa.update(reservations)
            .where(reservations.c.id == reservation_id)
            .values(status="released", released_at=sa.func.now(), updated_at=sa.func.now())
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


async def _held_amounts(conn: AsyncConnection, live: list[Any]) -> dict[str, Decimal]:
    """What live allocations hold: atoms per device class and scalar amounts. This is exactly what the
    reservation charged to quota and added to the rollup (read back from the rows, not recomputed)."""
    held: dict[str, Decimal] = defaultdict(Decimal)
    atoms = [atom for a in live for atom in a.atoms]
    if atoms:
        for cls, count in (
            await conn.execute(
                sa.select(devices.c["class"], sa.func.count())
                .where(devices.c.id.in_(atoms))
                .group_by(devices.c["class"])
            )
        ).all():
            held[cls] += Decimal(count)
    for a in live:
        for resource, amount in (a.resources or {}).items():
            held[resource] += Decimal(amount)
    return dict(held)


async def free_allocations(
    conn: AsyncConnection, live: list[Any], pool_id: str, held: Mapping[str, Decimal]
) -> None:
    """Free live allocations: bookings, scalar ``allocated``, rollup (lock order pools -> ... -> rollup).
    ``held`` is what they hold (:func:`_held_amounts`)."""
    if not live:
        return
    await lock_pool(conn, pool_id, for_update=False)
    for a in live:
        await conn.execute(sa.delete(device_bookings).where(device_bookings.c.allocation_id == a.id))
        for resource, amount in sorted((a.resources or {}).items()):
            await conn.execute(
                sa.update(node_resources)
                .where(node_resources.c.node_id == a.node_id, node_resources.c.resource == resource)
                .values(allocated=sa.func.greatest(node_resources.c.allocated - Decimal(amount), 0))
            )
    await conn.execute(
        sa.update(allocations)
        .where(allocations.c.id.in_([a.id for a in live]))
        .values(released_at=sa.func.now())
    )
    await apply_rollup_delta(conn, pool_id, held, sign=-1)


async def preview(
    engine: AsyncEngine, cache: PoolCache, config: CapacityConfig, body: ReservationRequest
) -> dict[str, Any]:
    """The pipeline without the commit: ``{fits, candidates: [{nodeId, atoms, score, scores}], reason?}``
    with up to 10 candidates, best first (for a gang: its members). Checks neither quota nor writes."""
    async with engine.connect() as conn:
        now = await db_now(conn)
        check_start(body, now)
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
        return {"fits": False, "candidates": [], "reason": "the pool is archived"}
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
