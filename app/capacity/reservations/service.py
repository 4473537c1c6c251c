"""Reservations service: create (idempotent), get, list, release, and preview (docs/placement-rules.md).

create: one transaction; the whole POST takes at most 10 round trips to PostgreSQL, pool pre-pings
included (issue 15, tests/api/test_round_trips.py). The reservation row is inserted first with ``ON
CONFLICT (tenant_id, idempotency_key) DO NOTHING``, in the statement that reads the pool head (a plain
read: the row's foreign key holds the pool row only ``FOR KEY SHARE``, which no inventory change waits
for): concurrent creates with one key queue on that index entry, and the losers read the winner's row
(same body -> the same reservation; another body -> 409 IDEMPOTENCY_KEY_REUSED). Then the inline placer
plans on plain reads, locks the pool row ``FOR SHARE`` right before its first commit
(docs/placement-rules.md, "The pipeline": the critical section is the commit alone;
:class:`~app.db.locks.PoolShare`, shared with preemption, so a pool archived meanwhile answers ``the
pool is archived`` as one archived before the create does) and
commits the plan with the guarded statements, which also charge quota (409
QUOTA_EXCEEDED rolls everything back) and mark the row placed: the tenant's quota row is locked last,
by the commit's lock statement, and held to COMMIT only, not over the plan. A request that cannot be
placed is stored ``pending`` with its Unschedulable condition (reason ``NoFit``); its charge is checked
and refunded in the same transaction: quota holdings always equal the tenant's placed reservations,
each over its window.

Time (docs/lifecycle.md): bookings, scalar holdings and quota are held over the
reservation's window only, so a placed reservation stops counting at its end by itself; the lifecycle
controller then moves it to ``ended``
(:func:`app.capacity.controllers.lifecycle.end_reservations`). ``start`` is at most ``max_lead`` ahead
of the database clock.

release: locks the reservation row, cuts its quota holdings, then its bookings and scalar holdings, at
the release instant: what had not started is removed, what had is kept as history up to that instant.
A cut only shrinks what is held, so it takes no ``quota_usage`` or ``node_resources`` lock (lock order
of every capacity path: the reservation's own row -> pools -> nodes -> devices -> node_resources ->
quota_usage; docs/lifecycle.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.capacity.commit.cuts import cut_allocations
from app.capacity.commit.shapes import CommitExtras, MarkPlaced, QuotaCharge
from app.capacity.conditions import (
    no_fit_conditions,
    released_condition,
)
from app.capacity.config import PREVIEW_CANDIDATES, CapacityConfig
from app.capacity.edges import notify_pool
from app.capacity.placing import preemption
from app.capacity.placing.inline import Pending, Placed, db_now, place_inline
from app.capacity.planning.admission import admit, read_verdict, refusal
from app.capacity.planning.plan import plan_request
from app.capacity.planning.snapshot import PoolCache, PoolHead
from app.capacity.requests import check_start, placement_request, quota_amounts, spec_hash
from app.capacity.reservations.access import reservation_not_found, visible
from app.capacity.views import (
    committed_view,
    placed_view,
    read_allocations,
    read_view,
    reservation_view,
    row_view,
)
from app.db.locks import PoolShare, lock_pool, pool_not_found
from app.db.prepared import Prepared
from app.db.tables import TS, allocations, pools, reservations
from app.db.tx import reads, run_again_on_deadlock, sqlstate
from app.errors import IdempotencyKeyReused, InvalidInput
from app.iam.authorize import exists_for
from app.ids import new_id
from app.placement.model import Candidate, Plan
from app.placement.request import ReservationRequest
from app.placement.summary import ARCHIVED_POOL
from app.quota import charges, refunds

FOREIGN_KEY_VIOLATION = "23503"


def with_warnings(view: dict[str, Any], warnings: tuple[str, ...]) -> dict[str, Any]:
    """``view`` with a ``warnings`` list when intake had any (a create's answer only; not stored)."""
    if warnings:
        view["warnings"] = list(warnings)
    return view


@run_again_on_deadlock
async def create_reservation(
    engine: AsyncEngine,
    cache: PoolCache,
    config: CapacityConfig,
    body: ReservationRequest,
    *,
    before_commit: Callable[[int, Candidate], Awaitable[None]] | None = None,
) -> tuple[dict[str, Any], bool]:
    """Create (or find, for an idempotent retry) a reservation; returns ``(view, created)``.

    Raises NotFound (pool), QuotaExceeded, IdempotencyKeyReused; on any error nothing is written.
    ``before_commit(attempt, candidate)``: runs between an inline plan and its commit, before the pool
    lock (tests hold a plan open there, :func:`app.capacity.placing.inline.place_inline`).
    """
    spec = body.spec()
    digest = spec_hash(spec)
    assumptions: list[int] = []
    try:
        return await _create(engine, cache, config, body, spec, digest, assumptions, before_commit)
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
    before_commit: Callable[[int, Candidate], Awaitable[None]] | None = None,
) -> tuple[dict[str, Any], bool]:
    """The create transaction in named steps: insert the row (and lock the pool), answer a retry, place
    inline with the quota charge and the placed mark riding on the guarded commit, or store pending."""
    async with engine.begin() as conn:
        reservation_id = new_id("res")
        created_at, head = await _insert_reservation(conn, body, reservation_id, spec, digest)
        pool_share = PoolShare(body.poolId)  # taken right before the first commit, by either placement
        if created_at is None:
            return await idempotent_answer(conn, body, digest), False
        check_start(body, created_at, config.max_lead)  # raising rolls the row back: nothing is written
        request = placement_request(config, body, created_at)
        assert request.start is not None and request.end is not None
        warnings = await admit(conn, cache, head, request)  # raising rolls the row back, as above
        charge = QuotaCharge(
            body.tenantId, body.poolId, reservation_id, quota_amounts(request), request.start, request.end
        )
        outcome = await place_inline(
            conn,
            cache,
            request,
            reservation_id,
            config.options,
            config.max_attempts,
            config.shortlist_min,
            before_commit,
            extras=CommitExtras(charge, MarkPlaced(reservation_id, request.end)),
            head=head,
            pool_share=pool_share,
        )
        if isinstance(outcome, Pending) and preemption.applies(config.preemption, request):
            how = preemption.PreemptOptions(config.options, config.max_attempts, charge)
            by_preemption = await preemption.place_preempting(
                conn, cache, request, reservation_id, how, created_at, pool_share
            )
            if by_preemption is not None:
                assumptions.extend(by_preemption.placed.assumptions)
                allocs = [committed_view(a, request) for a in by_preemption.placed.allocations]
                conditions = [by_preemption.condition]
                await _mark_placed(conn, reservation_id, request.end, conditions)
                return with_warnings(
                    placed_view(body, reservation_id, spec, created_at, allocs, conditions), warnings
                ), True
        if isinstance(outcome, Placed):
            assumptions.extend(outcome.assumptions)
            allocs = [committed_view(a, request) for a in outcome.allocations]
            return with_warnings(placed_view(body, reservation_id, spec, created_at, allocs), warnings), True
        assert isinstance(outcome, Pending)
        # archived while preemption planned: the lock saw it, and the answer is the archived pool's
        reason = ARCHIVED_POOL if pool_share.archived else outcome.reason
        return with_warnings(await _store_pending(conn, charge, reason), warnings), True


# WITH inserted AS (INSERT INTO reservations (...) VALUES (...) ON CONFLICT (tenant_id, idempotency_key)
#                   DO NOTHING RETURNING created_at)       -- no row: the key was used (or is being used)
# SELECT inserted.created_at, p.id, p.archived_at, p.inventory_version
#   FROM pools p LEFT JOIN inserted ON true WHERE p.id = :pool
#                          -- a plain read: the pool row is locked FOR SHARE only right before the commit
_POOL_ID = sa.bindparam("pool_id", type_=sa.Text)
_INSERTED = (
    pg_insert(reservations)
    .values(
        id=sa.bindparam("reservation_id", type_=sa.Text),
        tenant_id=sa.bindparam("tenant_id", type_=sa.Text),
        pool_id=_POOL_ID,
        status=sa.literal_column("'pending'"),
        spec=sa.bindparam("spec", type_=reservations.c.spec.type),
        spec_hash=sa.bindparam("spec_hash", type_=sa.Text),
        idempotency_key=sa.bindparam("idempotency_key", type_=sa.Text),
    )
    .on_conflict_do_nothing(index_elements=["tenant_id", "idempotency_key"])
    .returning(reservations.c.created_at)
    .cte("inserted")
)
INSERT_RESERVATION = Prepared(
    sa.select(_INSERTED.c.created_at, pools.c.id, pools.c.archived_at, pools.c.inventory_version)
    .select_from(pools.outerjoin(_INSERTED, sa.true()))
    .where(pools.c.id == _POOL_ID)
)
"""The statement above, built and compiled once and run prepared (issue 15: no per-call construct)."""


async def _insert_reservation(
    conn: AsyncConnection, body: ReservationRequest, reservation_id: str, spec: dict[str, Any], digest: str
) -> tuple[datetime | None, PoolHead]:
    """Insert the ``pending`` row and read the pool head (no lock) in one round trip
    (:data:`INSERT_RESERVATION`): the database's ``now()`` (None for a used key) and the head. NotFound
    (nothing written) for no pool."""
    params = {
        "reservation_id": reservation_id,
        "tenant_id": body.tenantId,
        "pool_id": body.poolId,
        "spec": spec,
        "spec_hash": digest,
        "idempotency_key": body.idempotencyKey,
    }
    try:
        row = (await INSERT_RESERVATION.run(conn, params)).first()
    except IntegrityError as exc:  # the pool foreign key: no such pool, and nothing was written
        if sqlstate(exc) == FOREIGN_KEY_VIOLATION:
            raise pool_not_found(body.poolId) from None
        raise
    if row is None:  # no pool row (the insert's foreign key raised first when it ran)
        raise pool_not_found(body.poolId)
    return row.created_at, PoolHead(row.id, row.archived_at is not None, row.inventory_version)


async def idempotent_answer(conn: AsyncConnection, body: ReservationRequest, digest: str) -> dict[str, Any]:
    """The reservation an earlier create with this key made (same body), or 409 IDEMPOTENCY_KEY_REUSED
    (``SELECT * FROM reservations WHERE tenant_id = :tenant AND idempotency_key = :key``; the key's
    writer has committed: the create's ``ON CONFLICT`` waited for it)."""
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
    return await reservation_view(conn, existing)


_RESERVATION_ID = sa.bindparam("reservation_id", type_=sa.Text)
_CONDITIONS = sa.bindparam("conditions", type_=reservations.c.conditions.type)

# UPDATE reservations SET status = 'placed', conditions = :conditions, ends_at = :ends_at,
#   updated_at = now() WHERE id = :reservation_id
MARK_PLACED = Prepared(
    sa.update(reservations)
    .where(reservations.c.id == _RESERVATION_ID)
    .values(
        status=sa.literal_column("'placed'"),
        conditions=_CONDITIONS,
        ends_at=sa.bindparam("ends_at", type_=TS),
        updated_at=sa.func.now(),
    )
)

# UPDATE reservations SET conditions = :conditions, updated_at = now() WHERE id = :reservation_id
#   RETURNING *
STORE_PENDING = Prepared(
    sa.update(reservations)
    .where(reservations.c.id == _RESERVATION_ID)
    .values(conditions=_CONDITIONS, updated_at=sa.func.now())
    .returning(*reservations.c)
)


async def _mark_placed(
    conn: AsyncConnection, reservation_id: str, end: datetime, conditions: list[dict[str, Any]]
) -> None:
    """Mark the reservation ``placed`` with ``conditions`` (a preemptor's, which the commit's own placed
    mark cannot carry: it is known only once the victims are chosen); :data:`MARK_PLACED`, prepared."""
    await MARK_PLACED.run(conn, {"reservation_id": reservation_id, "conditions": conditions, "ends_at": end})


async def _store_pending(conn: AsyncConnection, charge: QuotaCharge, reason: str) -> dict[str, Any]:
    """Nothing fit: the charge is still checked (over quota is 409 even when nothing fits) and refunded
    (a pending request holds nothing), and the row keeps ``pending`` with its Unschedulable condition."""
    await charges.charge(
        conn,
        charge.tenant_id,
        charge.pool_id,
        charge.reservation_id,
        charge.amounts,
        charge.start,
        charge.end,
    )
    await refunds.refund(conn, charge.reservation_id)
    params = {"reservation_id": charge.reservation_id, "conditions": no_fit_conditions(reason)}
    row = (await STORE_PENDING.run(conn, params)).one()  # prepared
    return row_view(row, [])


@reads
async def get_reservation(
    conn: AsyncConnection, reservation_id: str, tenant_id: str | None
) -> dict[str, Any]:
    """The reservation view (one statement, :func:`read_view`); another tenant's reservation
    (``tenant_id`` set) is NotFound, not 403."""
    view = await read_view(conn, reservation_id)
    if view is None or not exists_for(tenant_id, view["tenantId"]):
        raise reservation_not_found(reservation_id)
    return view


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
    allocs = await read_allocations(conn, [r.id for r in page])
    items = [row_view(r, allocs.get(r.id, [])) for r in page]
    return {"items": items, "next": (items[-1]["createdAt"], items[-1]["id"]) if more else None}


@run_again_on_deadlock
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
            return await reservation_view(conn, row)
        at = now if now is not None else await db_now(conn)
        if row.status == "placed":
            await refunds.cut_holdings(conn, row.id, at)  # shrinks only: no quota_usage lock
            await free_allocations(conn, await _live_allocations(conn, row.id), row.pool_id, at)
            await notify_pool(conn, row.pool_id)  # wake edge: a release
        await conn.execute(
            sa.update(reservations)
            .where(reservations.c.id == reservation_id)
            .values(
                status="released",
                released_at=at,
                updated_at=sa.func.now(),
                conditions=[*row.conditions, released_condition(at, row.status)],
            )
        )
        row = (await conn.execute(sa.select(reservations).where(reservations.c.id == reservation_id))).one()
        return await reservation_view(conn, row)


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
    await cut_allocations(conn, [a.id for a in live], at)  # app.capacity.commit.cuts


async def preview(
    engine: AsyncEngine, cache: PoolCache, config: CapacityConfig, body: ReservationRequest
) -> dict[str, Any]:
    """The pipeline without the commit: ``{fits, candidates: [{nodeId, atoms, score, scores}], reason?,
    preemptible?}`` with up to 10 candidates, best first (for a gang: its members). ``preemptible``: a
    regular request that fits only by preempting spot work (:func:`preemption.preemptible_view`).
    Checks neither quota nor writes."""
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
        intake = await read_verdict(conn, cache, outcome.head, request)  # the cached inventory: no read
        error = refusal(intake)
        if isinstance(error, InvalidInput):
            raise error
        if intake.unsatisfiable is not None:
            # it fits nowhere as the pool is built (docs/api.md, "Checked at intake"): not an error here
            answer = {"fits": False, "satisfiable": False, "candidates": [], "reason": intake.unsatisfiable}
            return with_warnings(answer, intake.warnings)
        preemptible = None
        if not isinstance(outcome.plan, Plan) and not outcome.head.archived:
            if preemption.applies(config.preemption, request):
                preemptible = await preemption.preview_preemptible(conn, cache, request, config.options, now)
    if outcome.head.archived:
        return {"fits": False, "candidates": [], "reason": ARCHIVED_POOL}
    plan = outcome.plan
    if not isinstance(plan, Plan):
        answer: dict[str, Any] = {"fits": False, "candidates": [], "reason": plan.summary}
        if preemptible is not None:
            answer["preemptible"] = preemptible
        return with_warnings(answer, intake.warnings)
    return with_warnings(
        {
            "fits": True,
            "candidates": [
                {
                    "nodeId": c.node_id,
                    "nodeName": c.node_name,
                    "atoms": list(c.atoms),
                    "score": round(c.score, 6),
                    "scores": {k: round(v, 6) for k, v in c.scores.items()},
                }
                # a gang preview shows the members of the best gang (docs/placement-rules.md, "Previewing a
                # placement")
                for c in (plan.members or plan.ranked[:PREVIEW_CANDIDATES])
            ],
        },
        intake.warnings,
    )
