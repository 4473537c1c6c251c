"""Release a reservation (``POST /v1/reservations/{id}/release``; docs/lifecycle.md), and the cut of
live allocations that BookingRepair shares (:func:`free_allocations`).

The release locks the reservation row, cuts its quota holdings, then its bookings and scalar holdings,
at the release instant: what had not started is removed, what had is kept as history up to that
instant. A cut only shrinks what is held, so it takes no ``quota_usage`` or ``node_resources`` lock
(lock order of every capacity path: the reservation's own row -> pools -> nodes -> devices ->
node_resources -> quota_usage; docs/lifecycle.md).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.answers.reservations import Condition, Reservation
from app.capacity.commit.cuts import cut_allocations
from app.capacity.commit.plans import drop_plans
from app.capacity.conditions import appended, released_condition, without_planned
from app.capacity.edges import notify_pool
from app.capacity.placing.inline import statement_now
from app.capacity.reservations.access import lock_visible
from app.capacity.views import reservation_view
from app.db.locks import lock_pool
from app.db.tables import allocations, reservations
from app.db.tx import run_again_on_deadlock
from app.quota import refunds


@run_again_on_deadlock
async def release_reservation(
    engine: AsyncEngine, reservation_id: str, tenant_id: str | None, now: datetime | None = None
) -> Reservation:
    """Release a reservation at ``now`` (default: the database clock): its quota holdings, bookings and
    scalar holdings are cut at that instant (removed when the window had not started), its allocations
    keep ``start``, ``end`` and get ``releasedAt``, and it gets a ``Released`` condition. A pending
    reservation's planned window is dropped (docs/lifecycle.md, "Planned starts"). Releasing
    twice, or releasing an ended or preempted reservation, is a no-op that answers the reservation.
    Another tenant's reservation is NotFound."""
    async with engine.begin() as conn:
        row = await lock_visible(conn, reservation_id, tenant_id)  # FOR UPDATE, first in the lock order
        if row.status in ("released", "preempted", "ended"):
            return await reservation_view(conn, row)
        # the instant after the row lock: a repair or wake that held the row first wrote later instants
        at = now if now is not None else await statement_now(conn)
        if row.status == "placed":
            await refunds.cut_holdings(conn, row.id, at)  # shrinks only: no quota_usage lock
            await free_allocations(conn, await _live_allocations(conn, row.id), row.pool_id, at)
            await notify_pool(conn, row.pool_id)  # wake edge: a release
        elif row.status == "pending" and await drop_plans(conn, [row.id]):
            await notify_pool(conn, row.pool_id)  # wake edge: its planned window is free again
        await close_reservation(
            conn, reservation_id, "released", row.conditions, released_condition(at, row.status), at
        )
        row = (await conn.execute(sa.select(reservations).where(reservations.c.id == reservation_id))).one()
        return await reservation_view(conn, row)


async def close_reservation(
    conn: AsyncConnection,
    reservation_id: str,
    status: str,
    conditions: list[dict[str, Any]] | None,
    closing: Condition,
    released_at: datetime | None = None,
) -> None:
    """The last status of a reservation whose row the caller holds: ``released`` (a release, at
    ``released_at``) or ``ended`` (the lifecycle's sweeps), its stored ``conditions`` without the
    ``Planned`` one and with ``closing`` added, its planned start cleared::

        UPDATE reservations SET status = :status, [released_at = :at,] planned_start = NULL,
               conditions = :conditions, updated_at = now() WHERE id = :reservation_id
    """
    values: dict[str, Any] = {"released_at": released_at} if released_at is not None else {}
    await conn.execute(
        sa.update(reservations)
        .where(reservations.c.id == reservation_id)
        .values(
            status=status,
            planned_start=None,
            conditions=appended(without_planned(conditions), closing),
            updated_at=sa.func.now(),
            **values,
        )
    )


async def _live_allocations(conn: AsyncConnection, reservation_id: str) -> list[Any]:
    """The ``allocations`` rows of the reservation not released yet, by node id."""
    # SELECT * FROM allocations WHERE reservation_id = :reservation_id AND released_at IS NULL
    #   ORDER BY node_id
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
