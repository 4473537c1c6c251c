"""Whether planned windows are why a request does not fit (docs/lifecycle.md, "Planned starts").

A planned window is a real allocation (flagged ``planned``) and holds its atoms and scalars like any
booking, so a plan counts it as taken. When a request does not fit for its window, the question a user
asks next is whether the queue's plans are why: :func:`planned_in_the_way` plans the request once more on
the same whole-pool read, with the planned windows overlapping its window not counted. When that plan
fits, the planned windows are why, and the preview's reason says so with :func:`planned_note`.

Reads, plain (no locks)::

    SELECT a.id, a.reservation_id FROM reservations r JOIN allocations a ON a.reservation_id = r.id
     WHERE r.status = 'pending' AND r.planned_start IS NOT NULL AND r.pool_id = :pool
       AND a.planned AND a.during && tstzrange(:start, :end)

(the partial index of planned starts), then, only when some overlap, the whole-pool snapshot of
:func:`~app.capacity.planning.snapshot.read_snapshot` without them.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.planning.snapshot import PoolCache, PoolHead, read_snapshot
from app.db.tables import allocations, reservations
from app.db.windows import window
from app.placement.gang import plan_gang
from app.placement.model import PlacementRequest, Plan
from app.placement.options import SchedulerOptions
from app.placement.pipeline import plan_placement


def planned_note(reservations_in_the_way: int) -> str:
    """``planned windows of <n> pending reservation(s) hold what it needs``: the clause the preview's
    reason ends with when those planned windows are why it does not fit."""
    plural = "s" if reservations_in_the_way != 1 else ""
    return f"planned windows of {reservations_in_the_way} pending reservation{plural} hold what it needs"


async def planned_in_the_way(
    conn: AsyncConnection,
    cache: PoolCache,
    request: PlacementRequest,
    options: SchedulerOptions,
    head: PoolHead,
) -> int:
    """How many pending reservations hold planned windows without which ``request`` would fit for its
    window ``[start, end)``: 0 when no planned window overlaps it, or when it does not fit without them
    either. Plans the whole pool as :func:`~app.capacity.planning.plan.plan_request` does when no node
    fits (same pipeline, or the gang planner)."""
    assert request.start is not None and request.end is not None
    stmt = (
        sa.select(allocations.c.id, allocations.c.reservation_id)
        .join(reservations, reservations.c.id == allocations.c.reservation_id)
        .where(
            reservations.c.status == "pending",
            reservations.c.planned_start.is_not(None),
            reservations.c.pool_id == request.pool_id,
            allocations.c.planned.is_(True),
            allocations.c.during.op("&&")(window(request.start, request.end)),
        )
    )
    rows = (await conn.execute(stmt)).all()
    if not rows:
        return 0
    _, snapshot = await read_snapshot(
        conn, cache, request.pool_id, request.start, request.end, head=head, ignoring=[r.id for r in rows]
    )
    planner = plan_gang if request.gang is not None and request.gang.members > 1 else plan_placement
    if not isinstance(planner(request, snapshot, options), Plan):
        return 0
    return len({r.reservation_id for r in rows})
