"""Extend a placed reservation (``POST /v1/reservations/{id}/extend``; docs/lifecycle.md, "Extend"): the
same atoms and the same scalar amounts on the same node(s), to a later end, or nothing at all.

One transaction, in the lock order of docs/architecture.md: the reservation row ``FOR UPDATE`` (a
release, a repair, a preemption or the end of the window waits, or made it other than ``placed``
already), the pool ``FOR SHARE``, then per live allocation in node id order the guarded commit's lock
statement (nodes -> devices -> node_resources), the bookings and the scalar holdings lengthened under
their guards (:mod:`app.capacity.commit.extension`), and last the quota charge of the extension window
(:func:`app.quota.charges.extend_charge`, quota_usage). Every refusal raises, so the transaction rolls
back and nothing changes:

- 409 CONFLICT naming what stands in ``[old end, new end)``: an atom booked by another reservation, a
  scalar of the node that would run out, the node or an atom no longer schedulable, or a reservation
  that is not ``placed`` (pending, queued, released, preempted, ended) or whose window is over;
- 409 QUOTA_EXCEEDED: the tenant's quota does not hold somewhere in the extension window;
- 422 INVALID_INPUT at ``end``: before the current end, or more than ``BC_CAPACITY_MAX_LEAD`` ahead
  of the database clock.

The blocking reservation is named by id only when the caller may read its tenant's work (the rule of
:func:`app.iam.authorize.may_read_work_of`, given as ``may_see``); otherwise "another reservation". The
same end again is a no-op that answers the reservation (200).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.answers.reservations import Reservation
from app.capacity.commit.extension import (
    Blocker,
    as_candidate,
    atom_blocker,
    extend_allocations,
    extend_bookings,
    extend_holdings,
    holdings_of,
    lock_allocation,
    scalar_blocker,
)
from app.capacity.commit.lost_races import atom_booked
from app.capacity.conditions import appended, extended_condition
from app.capacity.config import MAX_LEAD
from app.capacity.placing.inline import statement_now
from app.capacity.reservations.access import lock_visible, reservation_named
from app.capacity.views import reservation_view
from app.db.locks import lock_pool
from app.db.tables import allocations, device_bookings, nodes, reservations
from app.db.tx import run_again_on_deadlock
from app.errors import Conflict, InvalidInput, QuotaExceeded
from app.jsonnum import num
from app.observability.metrics import RESERVATION_EXTENDS
from app.placement.model import PlacementRequest
from app.quota import charges

ANOTHER = "another reservation"


async def extend_reservation(
    engine: AsyncEngine,
    reservation_id: str,
    tenant_id: str | None,
    end: datetime,
    may_see: Callable[[str], bool],
    max_lead: timedelta = MAX_LEAD,
) -> Reservation:
    """Extend the reservation to ``end`` (see the module docstring) and answer it; counted in
    ``bc_reservation_extends_total`` by result (docs/metrics.md). ``tenant_id``: the caller's tenant
    (another tenant's reservation is NotFound); ``may_see(tenant)``: whether a blocker of that tenant
    may be named. Raises Conflict, QuotaExceeded, InvalidInput or NotFound (nothing changed then)."""
    try:
        view, changed = await _extend(engine, reservation_id, tenant_id, end, may_see, max_lead)
    except QuotaExceeded:
        RESERVATION_EXTENDS.labels("quota").inc()
        raise
    except Conflict:
        RESERVATION_EXTENDS.labels("conflict").inc()
        raise
    if changed:
        RESERVATION_EXTENDS.labels("extended").inc()
    return view


@run_again_on_deadlock
async def _extend(
    engine: AsyncEngine,
    reservation_id: str,
    tenant_id: str | None,
    end: datetime,
    may_see: Callable[[str], bool],
    max_lead: timedelta,
) -> tuple[Reservation, bool]:
    async with engine.begin() as conn:
        row = await lock_visible(conn, reservation_id, tenant_id)  # FOR UPDATE, first in the lock order
        named = reservation_named(reservation_id)
        if row.status != "placed":
            raise Conflict(
                f"{named} is {row.status}: only a placed reservation can be extended",
                {"status": row.status},
            )
        old_end: datetime = row.ends_at
        if end == old_end:
            return await reservation_view(conn, row), False  # the same end again: nothing to do
        if end < old_end:
            raise InvalidInput(
                f"end {end.isoformat()} is before the reservation's end {old_end.isoformat()}: an "
                "extension only lengthens the window",
                path="end",
            )
        now = await statement_now(conn)  # after the row lock
        if old_end <= now:
            raise Conflict(f"{named}'s window ended at {old_end.isoformat()}", {"end": old_end.isoformat()})
        if end > now + max_lead:
            raise InvalidInput(
                f"end {end.isoformat()} is more than {max_lead.days} days ahead "
                f"(now {now.isoformat()}, at most {(now + max_lead).isoformat()})",
                path="end",
            )
        await lock_pool(conn, row.pool_id, for_update=False)
        live = await _live_allocations(conn, row.id)
        request = PlacementRequest(
            tenant_id=row.tenant_id, pool_id=row.pool_id, binding=(row.spec or {}).get("binding", "device")
        )
        for allocation in live:  # in node id order
            await _extend_allocation(conn, request, allocation, old_end, end, may_see)
        await charges.extend_charge(conn, row.tenant_id, row.pool_id, row.id, old_end, end)
        await extend_allocations(conn, [a.id for a in live], end)
        # UPDATE reservations SET ends_at = :end, conditions = :conditions, updated_at = now() WHERE id = :id
        await conn.execute(
            sa.update(reservations)
            .where(reservations.c.id == row.id)
            .values(
                ends_at=end,
                updated_at=sa.func.now(),
                conditions=appended(row.conditions, extended_condition(now, old_end, end)),
            )
        )
        row = (await conn.execute(sa.select(reservations).where(reservations.c.id == row.id))).one()
        return await reservation_view(conn, row), True


async def _live_allocations(conn: AsyncConnection, reservation_id: str) -> list[Any]:
    """The reservation's allocations held up to its end (not released, not a planned window), with
    their node's name, in node id order."""
    # SELECT a.*, n.name AS node_name FROM allocations a JOIN nodes n ON n.id = a.node_id
    #  WHERE a.reservation_id = :reservation_id AND a.released_at IS NULL AND NOT a.planned ORDER BY a.node_id
    return list(
        (
            await conn.execute(
                sa.select(allocations, nodes.c.name.label("node_name"))
                .join(nodes, nodes.c.id == allocations.c.node_id)
                .where(
                    allocations.c.reservation_id == reservation_id,
                    allocations.c.released_at.is_(None),
                    allocations.c.planned.is_(False),
                )
                .order_by(allocations.c.node_id)
            )
        ).all()
    )


async def _extend_allocation(
    conn: AsyncConnection,
    request: PlacementRequest,
    allocation: Any,
    old_end: datetime,
    new_end: datetime,
    may_see: Callable[[str], bool],
) -> None:
    """Lock and lengthen one allocation's bookings and scalar holdings, or raise Conflict naming what
    stands in the way."""
    booked = list(
        (
            await conn.execute(
                sa.select(device_bookings.c.device_id).where(device_bookings.c.allocation_id == allocation.id)
            )
        ).scalars()
    )
    candidate = as_candidate(allocation, allocation.node_name, booked)
    lost = await lock_allocation(conn, request, candidate)
    if lost is not None:
        raise Conflict(f"cannot extend to {new_end.isoformat()}: {lost.reason}", {"nodeId": lost.node_id})
    blocker = await atom_blocker(conn, allocation.id, old_end, new_end)
    if blocker is None and booked and not await extend_bookings(conn, allocation.id, old_end, new_end):
        blocker = await atom_blocker(conn, allocation.id, old_end, new_end)  # committed meanwhile
        if blocker is None:  # gone again already: refuse without a name rather than guess
            lost = atom_booked(allocation.node_id, allocation.node_name)
            raise Conflict(
                f"cannot extend to {new_end.isoformat()}: {lost.reason}",
                {"nodeId": allocation.node_id, "reservationId": None},
            )
    if blocker is not None:
        raise _atom_conflict(blocker, allocation, new_end, may_see)
    wanted = await holdings_of(conn, allocation.id, old_end)
    held = await extend_holdings(conn, allocation.id, old_end, new_end)
    short = next((r for r in sorted(wanted) if r not in held), None)
    if short is not None:
        blocker = await scalar_blocker(conn, allocation.node_id, short, old_end, new_end)
        raise _scalar_conflict(blocker, short, wanted[short], allocation, new_end, may_see)


def _who(blocker: Blocker | None, may_see: Callable[[str], bool]) -> str | None:
    """The blocker's reservation id when the caller may see its tenant's work, else None."""
    if blocker is None or not may_see(blocker.tenant_id):
        return None
    return blocker.reservation_id


def _atom_conflict(
    blocker: Blocker, allocation: Any, new_end: datetime, may_see: Callable[[str], bool]
) -> Conflict:
    """``cannot extend to <end>: atom <id> on <node> is booked from <start> by reservation '<id>'`` (or
    ``by another reservation``)."""
    who = _who(blocker, may_see)
    by = reservation_named(who) if who else ANOTHER
    return Conflict(
        f"cannot extend to {new_end.isoformat()}: atom {blocker.what} on {allocation.node_name} is booked "
        f"from {blocker.at.isoformat()} by {by}",
        {
            "reservationId": who,
            "nodeId": allocation.node_id,
            "atom": blocker.what,
            "at": blocker.at.isoformat(),
        },
    )


def _scalar_conflict(
    blocker: Blocker | None,
    resource: str,
    amount: Any,
    allocation: Any,
    new_end: datetime,
    may_see: Callable[[str], bool],
) -> Conflict:
    """``cannot extend to <end>: <resource> on <node> would run out at <t> (<held> held of <cap>, <n>
    more needed), held there by reservation '<id>'`` (or ``by another reservation``)."""
    who = _who(blocker, may_see)
    by = reservation_named(who) if who else ANOTHER
    if blocker is None:  # nothing else holds it: the node's capacity itself shrank below the amount
        text = f"{resource} on {allocation.node_name} has no room for {num(amount)} more"
        at = None
    else:
        at = blocker.at.isoformat()
        text = (
            f"{resource} on {allocation.node_name} would run out at {at} ({num(blocker.held or 0)} held of "
            f"{num(blocker.cap or 0)}, {num(amount)} more needed), held there by {by}"
        )
    return Conflict(
        f"cannot extend to {new_end.isoformat()}: {text}",
        {"reservationId": who, "nodeId": allocation.node_id, "resource": resource, "at": at},
    )
