"""BookingRepair (docs/lifecycle.md; docs/placement-rules.md names it): work booked on an atom that
turned unhealthy or unbookable is moved for the rest of its window.

The health route and the node agents' edges (:func:`app.inventory.agent_hooks.on_atoms_unavailable`)
send the pool's repair edge; :mod:`app.capacity.controllers.repair_first` runs :func:`repair_broken` on it,
on its
own task and ahead of any wake (docs/lifecycle.md, "Repair first"), and periodically as a safety net.
It finds every live allocation with a booking on an
unavailable atom whose window is not over (the partial index of unavailable atoms keeps that cheap) and
repairs each reservation in one transaction, its row claimed ``FOR UPDATE SKIP LOCKED`` (replica-safe):

1. the allocation is cut at now (bookings and scalar holdings end there; the old allocation keeps its
   history with ``releasedAt``), then planned again for its remaining window ``[max(now, start), end)``
   on the same node only: another free healthy atom that fits the selector and topology;
2. else through the full pipeline on any node of the pool (dedications and the lease rule hold: the
   same filters and guarded commit as a create);
3. else the reservation goes ``pending`` (Unschedulable ``NoFit``, message ``repair: <pending
   summary>``), its quota holdings are cut at now, and it waits for a wake edge like any pending one.

The reservation gets a ``Repaired`` condition naming the old and new atoms and nodes and when. Since the
allocation is cut before the new plan and the plan reads in the same transaction, nothing stays booked on
the unhealthy atom after the repair commits, and the guarded commit keeps every other allocation safe.
Gang reservations are not repaired yet (their members would have to move together). A pending
reservation's planned window on a broken atom is not repaired: it is dropped
(:func:`drop_broken_plans`), and the planner plans the reservation again (docs/lifecycle.md, "Planned
starts").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.answers.reservations import Condition
from app.capacity.commit.plans import drop_plans
from app.capacity.conditions import (
    NO_FIT,
    appended,
    condition,
    from_stored,
    stored,
    with_unschedulable,
    without_planned,
)
from app.capacity.config import CapacityConfig
from app.capacity.edges import notify_pool
from app.capacity.placing.inline import Placed, db_now
from app.capacity.placing.registry import INLINE, PlacementContext, placer
from app.capacity.planning.snapshot import PoolCache
from app.capacity.requests import placement_request
from app.capacity.reservations.release import free_allocations
from app.db.locks import lock_reservation
from app.db.tables import allocations, device_bookings, devices, nodes, reservations
from app.observability.metrics import REPAIRS
from app.placement.request import ReservationRequest
from app.quota import refunds

REPAIR_BATCH = 100
SAME_NODE, OTHER_NODE, TO_PENDING = "same_node", "other_node", "pending"
REPAIR_PREFIX = "repair: "
REPAIRED = "Repaired"  # the condition type
ATOM_UNAVAILABLE_REASON = "AtomUnavailable"
NODE_DRAINING_REASON = "NodeDraining"  # a drain with reschedule (app.capacity.controllers.drain)
_CAUSES = {
    ATOM_UNAVAILABLE_REASON: "an atom turned unhealthy or unbookable",
    NODE_DRAINING_REASON: "its node is draining",
}


@dataclass(frozen=True, slots=True)
class Repair:
    """One repaired allocation: ``result`` same_node / other_node / pending, old and new placement."""

    reservation_id: str
    result: str
    old_node_id: str
    old_atoms: tuple[str, ...]
    new_node_id: str | None = None
    new_atoms: tuple[str, ...] = ()


def repaired_condition(
    at: datetime, repair: Repair, names: dict[str, str], reason: str = ATOM_UNAVAILABLE_REASON
) -> Condition:
    """The ``Repaired`` condition: old -> new atoms and nodes (node names in the message), and when;
    ``reason`` says why it moved (``AtomUnavailable``, ``NodeDraining``)."""
    old = f"{', '.join(repair.old_atoms)} on {names.get(repair.old_node_id, repair.old_node_id)}"
    if repair.new_node_id is None:
        new = "nothing (pending)"
    else:
        new = f"{', '.join(repair.new_atoms)} on {names.get(repair.new_node_id, repair.new_node_id)}"
    return condition(
        REPAIRED,
        reason,
        f"{_CAUSES[reason]}: {old} -> {new}",
        at=at.isoformat(),
        oldNodeId=repair.old_node_id,
        oldAtoms=list(repair.old_atoms),
        newNodeId=repair.new_node_id,
        newAtoms=list(repair.new_atoms),
    )


async def broken_reservations(conn: AsyncConnection, limit: int = REPAIR_BATCH) -> list[str]:
    """Placed reservations with a live booking on an unhealthy or unbookable atom it uses (one of its
    allocation's ``atoms``) whose window is not over, oldest first. A whole-node lease's held atoms
    (booked, not used: unavailable when it was placed) need no repair: the lease keeps them so that
    nothing else lands on its node (docs/lifecycle.md, "Whole-node leases")."""
    # SELECT DISTINCT a.reservation_id, r.created_at FROM device_bookings b
    #   JOIN devices d ON d.pk = b.device_pk JOIN allocations a ON a.id = b.allocation_id
    #   JOIN reservations r ON r.id = a.reservation_id
    #  WHERE (NOT d.healthy OR NOT d.bookable) AND b.device_id = ANY(a.atoms)
    #    AND upper(b.during) > now() AND a.released_at IS NULL
    #    AND r.status = 'placed' ORDER BY r.created_at LIMIT :limit
    stmt = (
        sa.select(allocations.c.reservation_id, reservations.c.created_at)
        .select_from(
            device_bookings.join(devices, devices.c.pk == device_bookings.c.device_pk)
            .join(allocations, allocations.c.id == device_bookings.c.allocation_id)
            .join(reservations, reservations.c.id == allocations.c.reservation_id)
        )
        .where(
            sa.or_(devices.c.healthy.is_(False), devices.c.bookable.is_(False)),
            device_bookings.c.device_id == sa.any_(allocations.c.atoms),
            sa.func.upper(device_bookings.c.during) > sa.func.now(),
            allocations.c.released_at.is_(None),
            reservations.c.status == "placed",
        )
        .distinct()
        .order_by(reservations.c.created_at)
        .limit(limit)
    )
    return [r.reservation_id for r in (await conn.execute(stmt)).all()]


async def drop_broken_plans(engine: AsyncEngine) -> list[str]:
    """Drop the planned windows (docs/lifecycle.md, "Planned starts") that book an unhealthy or
    unbookable atom, in one transaction, the pending reservations claimed ``FOR UPDATE SKIP LOCKED``
    (replica-safe); each pool that lost one gets a wake edge, and the planner's next pass plans the
    reservation again around the broken atom. Returns the reservations' ids."""
    # ... AND EXISTS (SELECT 1 FROM allocations a JOIN device_bookings b ON b.allocation_id = a.id
    #                   JOIN devices d ON d.pk = b.device_pk
    #                  WHERE a.reservation_id = r.id AND a.planned AND NOT (d.healthy AND d.bookable))
    #  ORDER BY r.created_at LIMIT :limit FOR UPDATE OF r SKIP LOCKED
    booked_atoms = allocations.join(device_bookings, device_bookings.c.allocation_id == allocations.c.id)
    joined = booked_atoms.join(devices, devices.c.pk == device_bookings.c.device_pk)
    broken = sa.not_(sa.and_(devices.c.healthy, devices.c.bookable))
    async with engine.begin() as conn:
        return await drop_plans_where(conn, broken, joined=joined, limit=REPAIR_BATCH, skip_locked=True)


async def drop_plans_where(
    conn: AsyncConnection,
    *booked: sa.ColumnElement[bool],
    joined: sa.FromClause = allocations,
    limit: int | None = None,
    skip_locked: bool = False,
) -> list[str]:
    """Claim the pending reservations with a planned allocation matching ``booked`` (over ``joined``:
    ``allocations``, or allocations joined to the tables ``booked`` names), oldest first, and
    :func:`unplan` them; returns their ids. ``skip_locked``: a controller's replica-safe claim that never
    waits::

        SELECT r.id, r.conditions FROM reservations r
         WHERE r.status = 'pending' AND r.planned_start IS NOT NULL
           AND EXISTS (SELECT 1 FROM <joined> WHERE a.reservation_id = r.id AND a.planned AND <booked>)
         ORDER BY r.created_at [LIMIT :limit] FOR UPDATE OF r [SKIP LOCKED]
    """
    planned_there = (
        sa.select(sa.literal(1))
        .select_from(joined)
        .where(allocations.c.reservation_id == reservations.c.id, allocations.c.planned.is_(True), *booked)
    )
    claim = (
        sa.select(reservations.c.id, reservations.c.conditions)
        .where(
            reservations.c.status == "pending",
            reservations.c.planned_start.is_not(None),
            planned_there.exists(),
        )
        .order_by(reservations.c.created_at)
    )
    if limit is not None:
        claim = claim.limit(limit)
    rows = (await conn.execute(claim.with_for_update(of=reservations, skip_locked=skip_locked))).all()
    return await unplan(conn, rows)


async def unplan(conn: AsyncConnection, rows: Sequence[Any]) -> list[str]:
    """Drop the planned windows of the claimed pending reservations ``rows`` (``id``, ``conditions``),
    send each pool that lost one its wake edge (the planner plans them again) and clear their
    ``planned_start`` and ``Planned`` condition; returns their ids (docs/lifecycle.md, "Planned starts")."""
    for pool_id in await drop_plans(conn, [r.id for r in rows]):
        await notify_pool(conn, pool_id)
    for r in rows:
        await conn.execute(
            sa.update(reservations)
            .where(reservations.c.id == r.id)
            .values(planned_start=None, conditions=without_planned(r.conditions), updated_at=sa.func.now())
        )
    return [r.id for r in rows]


async def repair_broken(engine: AsyncEngine, cache: PoolCache, config: CapacityConfig) -> list[Repair]:
    """Repair every reservation :func:`broken_reservations` finds (one transaction each), after dropping
    the planned windows on broken atoms (:func:`drop_broken_plans`)."""
    await drop_broken_plans(engine)
    async with engine.connect() as conn:
        ids = await broken_reservations(conn)
    done: list[Repair] = []
    for reservation_id in ids:
        done += await repair_reservation(engine, cache, config, reservation_id)
    return done


async def repair_reservation(
    engine: AsyncEngine, cache: PoolCache, config: CapacityConfig, reservation_id: str
) -> list[Repair]:
    """Repair the reservation's allocations that book an unavailable atom (nothing when another
    replica holds it, it is no longer placed, or it is a gang)."""
    assumptions: list[int] = []
    pool_id = ""
    try:
        async with engine.begin() as conn:
            row = await lock_reservation(conn, reservation_id, placed_only=True, skip_locked=True)
            if row is None or row.spec.get("gang"):
                return []
            pool_id = row.pool_id
            return await _repair(conn, cache, config, row, assumptions)
    finally:
        for token in assumptions:
            cache.forget(pool_id, token)


async def _repair(
    conn: AsyncConnection, cache: PoolCache, config: CapacityConfig, row: Any, assumptions: list[int]
) -> list[Repair]:
    now = await db_now(conn)
    # the live allocations with an unavailable atom, window not over
    live = (
        await conn.execute(
            sa.select(allocations).where(
                allocations.c.reservation_id == row.id,
                allocations.c.released_at.is_(None),
                sa.func.upper(allocations.c.during) > now,
            )
        )
    ).all()
    atoms = [a for alloc in live for a in alloc.atoms]
    # a live allocation's atoms are live devices (a node holding one cannot be deleted); a deleted node's
    # devices may carry the same ids (docs/operating.md, "Maintenance: drain and delete")
    unavailable = set(
        (
            await conn.execute(
                sa.select(devices.c.id).where(
                    devices.c.id.in_(atoms),
                    devices.c.deleted_at.is_(None),
                    sa.or_(devices.c.healthy.is_(False), devices.c.bookable.is_(False)),
                )
            )
        ).scalars()
    )
    broken = [alloc for alloc in live if unavailable & set(alloc.atoms)]
    if not broken:
        return []
    [old] = broken  # not a gang: one allocation
    repair = await move_allocation(conn, cache, config, row, old, now, assumptions)
    REPAIRS.labels(repair.result).inc()
    return [repair]


async def move_allocation(
    conn: AsyncConnection,
    cache: PoolCache,
    config: CapacityConfig,
    row: Any,
    old: Any,
    now: datetime,
    assumptions: list[int],
    reason: str = ATOM_UNAVAILABLE_REASON,
) -> Repair:
    """Move the live allocation ``old`` of the placed, non-gang reservation ``row`` (its row held
    ``FOR UPDATE``) for the rest of its window ``[max(now, start), end)``: cut it at ``now`` (removed when
    it had not started), plan it again (on the same node first for ``AtomUnavailable``; a draining node
    refuses it anyway), else on any node of the pool through the full pipeline and the guarded commit,
    else send the reservation back to ``pending`` (its quota holdings dropped). The reservation gets a
    ``Repaired`` condition with ``reason``; a wake edge goes out when the old node's atoms were freed."""
    body = ReservationRequest.model_validate({**row.spec, "idempotencyKey": row.idempotency_key})
    start, end = max(now, old.during.lower), old.during.upper
    request = replace(placement_request(config, body, now), start=start, end=end)
    await free_allocations(conn, [old], row.pool_id, now)  # nothing stays booked on the old atoms
    pool_nodes = (
        await conn.execute(sa.select(nodes.c.id, nodes.c.name).where(nodes.c.pool_id == row.pool_id))
    ).all()
    names = {n.id: n.name for n in pool_nodes}
    others = frozenset(n.id for n in pool_nodes if n.id != old.node_id)
    same_node_only = replace(
        config.options,
        excluded_nodes=others,
        exclusion_reasons=dict.fromkeys(others, "repair tries the same node first"),
    )
    repair: Repair
    inline = placer(INLINE)  # BookingRepair always places inline (docs/placement-rules.md)
    context = PlacementContext(now, cache, same_node_only, row.id, config.max_attempts, config.shortlist_min)
    outcome = None
    result = SAME_NODE
    if reason == ATOM_UNAVAILABLE_REASON:
        outcome = await inline.place(conn, request, context)
    if not isinstance(outcome, Placed):
        outcome = await inline.place(conn, request, replace(context, options=config.options))
        result = OTHER_NODE
    if isinstance(outcome, Placed):
        assumptions.extend(outcome.assumptions)
        [new] = outcome.allocations
        repair = Repair(row.id, result, old.node_id, tuple(old.atoms), new.node_id, tuple(new.atoms))
        values: dict[str, Any] = {
            "conditions": appended(row.conditions, repaired_condition(now, repair, names, reason))
        }
    else:
        repair = Repair(row.id, TO_PENDING, old.node_id, tuple(old.atoms))
        await refunds.drop_holdings(conn, row.id)  # a pending reservation holds nothing
        history = [*from_stored(row.conditions), repaired_condition(now, repair, names, reason)]
        values = {
            "status": "pending",
            "ends_at": None,
            "conditions": stored(
                with_unschedulable(history, NO_FIT, REPAIR_PREFIX + outcome.reason, outcome.why)
            ),
        }
    await conn.execute(
        sa.update(reservations).where(reservations.c.id == row.id).values(**values, updated_at=sa.func.now())
    )
    if repair.result != SAME_NODE:
        await notify_pool(conn, row.pool_id)  # wake edge: a repair freed atoms (the old allocation's)
    return repair
