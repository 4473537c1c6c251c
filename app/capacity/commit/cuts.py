"""The one cut of allocations at an instant, shared by a release and a repair
(:func:`app.capacity.reservations.release.free_allocations`) and a preemption's eviction
(:func:`app.capacity.placing.preemption.evict_victims`): bookings and scalar holdings that had not started by
``at`` are removed, those that had end there, and the allocations get ``released_at = at``.

Cutting only shrinks what is held, so it takes no ``node_resources`` or ``quota_usage`` lock (the lock
order of :mod:`app.db.locks`): a guard that read the longer holding meanwhile was only more careful than
it had to be. The caller holds what it must (the pool row ``FOR SHARE``, or the victims' rows).
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.tables import TS, allocations, device_bookings, scalar_holdings
from app.db.windows import cut


async def cut_allocations(conn: AsyncConnection, ids: list[str], at: datetime) -> None:
    """Cut the allocations ``ids`` at ``at`` (see the module docstring); an empty list changes nothing.

    ``DELETE FROM device_bookings WHERE allocation_id = ANY(:ids) AND lower(during) >= :at``;
    ``UPDATE device_bookings SET during = tstzrange(lower(during), :at, '[)') WHERE allocation_id =
    ANY(:ids) AND during @> :at``; the same cut of ``scalar_holdings`` (:func:`app.db.windows.cut`);
    ``UPDATE allocations SET released_at = :at WHERE id = ANY(:ids)``."""
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
