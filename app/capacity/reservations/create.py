"""Create a reservation, inline (docs/placement-rules.md): ``POST /v1/reservations`` with the inline
placer, and the gangs and whole-node leases of any placer.

One transaction; the whole POST takes at most 10 round trips to PostgreSQL, pool pre-pings included
(issue 15, tests/api/test_round_trips.py). The reservation row is inserted first with ``ON CONFLICT
(tenant_id, idempotency_key) DO NOTHING``, in the statement that reads the pool head (a plain read: the
row's foreign key holds the pool row only ``FOR KEY SHARE``, which no inventory change waits for):
concurrent creates with one key queue on that index entry, and the losers read the winner's row (same
body -> the same reservation, :func:`idempotent_answer`; another body -> 409 IDEMPOTENCY_KEY_REUSED).
Then the inline placer plans on plain reads, locks the pool row ``FOR SHARE`` right before its first
commit (docs/placement-rules.md, "The pipeline": the critical section is the commit alone;
:class:`~app.db.locks.PoolShare`, shared with preemption, so a pool archived meanwhile answers ``the
pool is archived`` as one archived before the create does) and commits the plan with the guarded
statements, which also charge quota (409 QUOTA_EXCEEDED rolls everything back) and mark the row placed:
the tenant's quota row is locked last, by the commit's lock statement, and held to COMMIT only, not over
the plan. A request that cannot be placed is stored ``pending`` with its Unschedulable condition (reason
``NoFit``); its charge is checked and refunded in the same transaction: quota holdings always equal the
tenant's placed reservations, each over its window.

Time (docs/lifecycle.md): bookings, scalar holdings and quota are held over the reservation's window
only, so a placed reservation stops counting at its end by itself; the lifecycle controller then moves
it to ``ended`` (:func:`app.capacity.controllers.lifecycle.end_reservations`). ``start`` is at most
``max_lead`` ahead of the database clock.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.answers.reservations import Condition, Reservation
from app.capacity.commit.shapes import CommitExtras, MarkPlaced, QuotaCharge
from app.capacity.conditions import no_fit_conditions, stored
from app.capacity.config import CapacityConfig
from app.capacity.placing import preemption
from app.capacity.placing.earliest import place_earliest
from app.capacity.placing.inline import Pending, Placed, place_inline
from app.capacity.planning.admission import admit
from app.capacity.planning.snapshot import PoolCache, PoolHead
from app.capacity.requests import check_start, placement_request, quota_amounts, row_values, spec_hash
from app.capacity.reservations.plan_commit import commit_plan
from app.capacity.reservations.plan_tokens import read_claim
from app.capacity.views import committed_view, placed_view, reservation_view, row_view, with_warnings
from app.db.audit import note_created
from app.db.locks import PoolShare, pool_not_found
from app.db.prepared import Prepared
from app.db.tables import TS, pools, reservations
from app.db.tx import run_again_on_deadlock, sqlstate
from app.errors import IdempotencyKeyReused
from app.ids import new_id
from app.placement.model import Candidate
from app.placement.request import ReservationRequest
from app.placement.summary import ARCHIVED_POOL
from app.placement.why_not import WhyNot
from app.quota import charges, refunds

FOREIGN_KEY_VIOLATION = "23503"


@run_again_on_deadlock
async def create_reservation(
    engine: AsyncEngine,
    cache: PoolCache,
    config: CapacityConfig,
    body: ReservationRequest,
    *,
    before_commit: Callable[[int, Candidate], Awaitable[None]] | None = None,
    if_plan: str | None = None,
) -> tuple[Reservation, bool]:
    """Create (or find, for an idempotent retry) a reservation; returns ``(view, created)``, ``view``
    with ``warnings`` when intake had any (:func:`~app.capacity.views.with_warnings`).

    Raises NotFound (pool), QuotaExceeded, IdempotencyKeyReused; on any error nothing is written.
    ``before_commit(attempt, candidate)``: runs between an inline plan and its commit, before the pool
    lock (tests hold a plan open there, :func:`app.capacity.placing.inline.place_inline`).
    ``if_plan``: a preview's plan token, committed exactly or not at all (docs/api.md, "Plan tokens";
    :mod:`app.capacity.reservations.plan_commit`): also raises InvalidInput (``ifPlan``) and PlanStale.
    """
    spec = body.spec()
    digest = spec_hash(spec)
    assumptions: list[int] = []
    try:
        return await _create(engine, cache, config, body, spec, digest, assumptions, before_commit, if_plan)
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
    if_plan: str | None = None,
) -> tuple[Reservation, bool]:
    """The create transaction in named steps: insert the row (and lock the pool), answer a retry, place
    inline with the quota charge and the placed mark riding on the guarded commit (or commit the plan
    ``if_plan`` signed), or store pending."""
    async with engine.begin() as conn:
        reservation_id = new_id("res")
        created_at, head = await _insert_reservation(conn, body, reservation_id, spec, digest)
        pool_share = PoolShare(body.poolId)  # taken right before the first commit, by either placement
        if created_at is None:
            return await idempotent_answer(conn, body, digest), False
        note_created(reservation_id)  # the audit row written at COMMIT names it (app/db/audit.py)
        check_start(body, created_at, config.max_lead)  # raising rolls the row back: nothing is written
        request = placement_request(config, body, created_at)
        assert request.start is not None and request.end is not None
        warnings = await admit(conn, cache, head, request)  # raising rolls the row back, as above
        claim = None
        if if_plan is not None:  # the window is the plan's (docs/api.md, "Plan tokens"); raising: as above
            claim = await read_claim(conn, config, body, digest, if_plan, created_at)
            request = replace(request, start=claim.start, end=claim.end)
        charge = QuotaCharge(
            body.tenantId, body.poolId, reservation_id, quota_amounts(request), request.start, request.end
        )
        if claim is not None:  # exactly the plan, or 412 PLAN_STALE: never replanned
            extras = CommitExtras(charge, MarkPlaced(reservation_id, request.end))
            placed = await commit_plan(conn, cache, request, claim, reservation_id, extras, pool_share)
            assumptions.extend(placed.assumptions)
            allocs = [committed_view(a, request) for a in placed.allocations]
            return with_warnings(placed_view(body, reservation_id, spec, created_at, allocs), warnings), True
        if body.earliest:  # docs/lifecycle.md, "Earliest start": placed at the window found, or pending
            request, outcome = await place_earliest(
                conn,
                cache,
                config,
                request,
                reservation_id,
                created_at,
                before_commit=before_commit,
                head=head,
                pool_share=pool_share,
                deadline=body.deadline,
            )
        else:
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
        reason, why = (ARCHIVED_POOL, None) if pool_share.archived else (outcome.reason, outcome.why)
        return with_warnings(await _store_pending(conn, charge, reason, why), warnings), True


# WITH inserted AS (INSERT INTO reservations (..., deadline) VALUES (...)
#                   ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING created_at)
#                                                  -- no row: the key was used (or is being used)
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
        deadline=sa.bindparam("deadline", type_=TS),
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
    params = {"reservation_id": reservation_id, **row_values(body, spec, digest)}
    try:
        row = (await INSERT_RESERVATION.run(conn, params)).first()
    except IntegrityError as exc:  # the pool foreign key: no such pool, and nothing was written
        if sqlstate(exc) == FOREIGN_KEY_VIOLATION:
            raise pool_not_found(body.poolId) from None
        raise
    if row is None:  # no pool row (the insert's foreign key raised first when it ran)
        raise pool_not_found(body.poolId)
    return row.created_at, PoolHead(row.id, row.archived_at is not None, row.inventory_version)


async def idempotent_answer(conn: AsyncConnection, body: ReservationRequest, digest: str) -> Reservation:
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
    conn: AsyncConnection, reservation_id: str, end: datetime, conditions: list[Condition]
) -> None:
    """Mark the reservation ``placed`` with ``conditions`` (a preemptor's, which the commit's own placed
    mark cannot carry: it is known only once the victims are chosen); :data:`MARK_PLACED`, prepared."""
    params = {"reservation_id": reservation_id, "conditions": stored(conditions), "ends_at": end}
    await MARK_PLACED.run(conn, params)


async def _store_pending(
    conn: AsyncConnection, charge: QuotaCharge, reason: str, why: WhyNot | None = None
) -> Reservation:
    """Nothing fit: the charge is still checked (over quota is 409 even when nothing fits) and refunded
    (a pending request holds nothing), and the row keeps ``pending`` with its Unschedulable condition
    (with ``why``'s rejection rows and nearest misses, docs/reasons.md)."""
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
    params = {"reservation_id": charge.reservation_id, "conditions": stored(no_fit_conditions(reason, why))}
    row = (await STORE_PENDING.run(conn, params)).one()  # prepared
    return row_view(row, [])
