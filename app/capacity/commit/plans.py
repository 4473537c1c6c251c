"""The planned window of a pending reservation (docs/lifecycle.md, "Planned starts"): an allocation
written by the guarded commit like any placement, then flagged ``planned`` (:func:`mark_planned`), and
dropped again whole (:func:`drop_plans`) when the reservation is replanned, placed otherwise, released
or ended, or when an atom of it breaks.

A planned allocation is a real allocation with real bookings and scalar holdings, so the bookings'
exclusion constraint and the scalar guards keep every later commit off it (no double booking, by the
same statements that keep placements apart). It holds no quota: a pending reservation is charged when
its plan turns into a placement. Dropping a plan removes its rows (nothing of it ever started: a plan
is turned into a placement at its start, or dropped before), so it leaves no history; only shrinking
what is held, it takes no ``node_resources`` or ``quota_usage`` lock (the lock order of
:mod:`app.db.locks`).
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.tables import allocations


async def mark_planned(conn: AsyncConnection, allocation_ids: Iterable[str]) -> None:
    """Flag the allocations just committed for a pending reservation as its planned window::

    UPDATE allocations SET planned = true WHERE id = ANY(:ids)
    """
    ids = list(allocation_ids)
    if ids:
        await conn.execute(sa.update(allocations).where(allocations.c.id.in_(ids)).values(planned=True))


async def drop_plans(conn: AsyncConnection, reservation_ids: Iterable[str]) -> list[str]:
    """Remove the planned allocations of ``reservation_ids`` with their bookings and scalar holdings
    (``ON DELETE CASCADE``); returns the pools that had any (their capacity freed: a wake edge is due)::

    DELETE FROM allocations WHERE reservation_id = ANY(:ids) AND planned RETURNING pool_id
    """
    ids = list(reservation_ids)
    if not ids:
        return []
    statement = (
        sa.delete(allocations)
        .where(allocations.c.reservation_id.in_(ids), allocations.c.planned.is_(True))
        .returning(allocations.c.pool_id)
    )
    return sorted(set((await conn.execute(statement)).scalars()))


async def start_plan(conn: AsyncConnection, reservation_id: str) -> None:
    """Turn the reservation's planned allocations into its placement (their bookings stay as they are)::

    UPDATE allocations SET planned = false WHERE reservation_id = :id AND planned
    """
    await conn.execute(
        sa.update(allocations)
        .where(allocations.c.reservation_id == reservation_id, allocations.c.planned.is_(True))
        .values(planned=False)
    )
