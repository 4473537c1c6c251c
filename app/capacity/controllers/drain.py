"""What a drain does to the work booked on its node (docs/operating.md, "Maintenance: drain and delete").

The inventory marks the node draining first (:func:`app.inventory.maintenance.set_drain`, the NoSchedule
reason ``draining``, committed before this runs), so nothing planned here can land on it again. Then, in
transactions of their own, the reservations' rows claimed first (the lock order):

1. the planned windows on the node (pending reservations' planned starts, docs/lifecycle.md "Planned
   starts") are dropped, always: a planned start would otherwise place the work on the draining node;
   each pool that lost one gets a wake edge and the planner plans them again elsewhere;
2. with ``reschedule``, each placed reservation whose window on the node has not started yet is moved
   through BookingRepair's path (:func:`app.capacity.controllers.repair.move_allocation`, reason
   ``NodeDraining``): placed on another node for the same window, else back to ``pending``. Work whose
   window has begun is never touched, nor are gangs (their members would have to move together): they
   are answered ``kept``.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.answers.inventory import RescheduledReservation
from app.capacity.config import CapacityConfig
from app.capacity.controllers.repair import NODE_DRAINING_REASON, drop_plans_where, move_allocation
from app.capacity.placing.inline import db_now
from app.capacity.planning.snapshot import PoolCache
from app.db.locks import lock_reservation
from app.db.tables import allocations, reservations
from app.observability.metrics import DRAIN_MOVES

KEPT = "kept"


async def drop_plans_on_node(engine: AsyncEngine, node_id: str) -> list[str]:
    """Drop the planned windows booked on ``node_id`` (one transaction, the pending reservations' rows
    ``FOR UPDATE``: :func:`app.capacity.controllers.repair.drop_plans_where`); returns the reservations'
    ids. The planner plans them again, elsewhere::

        ... AND EXISTS (SELECT 1 FROM allocations a
                         WHERE a.reservation_id = r.id AND a.planned AND a.node_id = :node)
         ORDER BY r.created_at FOR UPDATE OF r
    """
    async with engine.begin() as conn:
        return await drop_plans_where(conn, allocations.c.node_id == node_id)


def _future_on_node(node_id: str, now: sa.ColumnElement[object]) -> list[sa.ColumnElement[bool]]:
    """The live, placed (not planned) allocations on ``node_id`` whose window starts after ``now``."""
    return [
        allocations.c.node_id == node_id,
        allocations.c.released_at.is_(None),
        allocations.c.planned.is_(False),
        sa.func.lower(allocations.c.during) > now,
    ]


async def reschedule_future_work(
    engine: AsyncEngine, cache: PoolCache, config: CapacityConfig, node_id: str
) -> list[RescheduledReservation]:
    """Move every placed reservation whose window on ``node_id`` has not started (one transaction each,
    its row ``FOR UPDATE``), earliest start first; gangs are ``kept``. The node must be draining already
    (else the plan could pick it again)."""
    # SELECT a.reservation_id FROM allocations a JOIN reservations r ON r.id = a.reservation_id
    #  WHERE a.node_id = :node AND a.released_at IS NULL AND NOT a.planned AND lower(a.during) > now()
    #    AND r.status = 'placed' GROUP BY a.reservation_id ORDER BY min(lower(a.during)), a.reservation_id
    async with engine.connect() as conn:
        ids = list(
            (
                await conn.execute(
                    sa.select(allocations.c.reservation_id)
                    .join(reservations, reservations.c.id == allocations.c.reservation_id)
                    .where(*_future_on_node(node_id, sa.func.now()), reservations.c.status == "placed")
                    .group_by(allocations.c.reservation_id)
                    .order_by(sa.func.min(sa.func.lower(allocations.c.during)), allocations.c.reservation_id)
                )
            ).scalars()
        )
    moved: list[RescheduledReservation] = []
    for reservation_id in ids:
        done = await _move_one(engine, cache, config, node_id, reservation_id)
        if done is not None:
            DRAIN_MOVES.labels(done.result).inc()
            moved.append(done)
    return moved


async def _move_one(
    engine: AsyncEngine, cache: PoolCache, config: CapacityConfig, node_id: str, reservation_id: str
) -> RescheduledReservation | None:
    """Move one reservation's future allocation off ``node_id``; None when it is no longer placed there
    in the future (released, or its window began meanwhile: current work is never touched)."""
    assumptions: list[int] = []
    pool_id = ""
    try:
        async with engine.begin() as conn:
            row = await lock_reservation(conn, reservation_id, placed_only=True)
            if row is None:
                return None
            pool_id = row.pool_id
            now = await db_now(conn)
            live = (
                await conn.execute(
                    sa.select(allocations).where(
                        allocations.c.reservation_id == row.id, *_future_on_node(node_id, sa.literal(now))
                    )
                )
            ).all()
            if not live:
                return None
            if row.spec.get("gang"):
                return RescheduledReservation(
                    reservationId=row.id, result=KEPT, fromNodeId=node_id, toNodeId=None
                )
            [old] = live  # not a gang: one allocation
            repair = await move_allocation(
                conn, cache, config, row, old, now, assumptions, reason=NODE_DRAINING_REASON
            )
            return RescheduledReservation(
                reservationId=row.id, result=repair.result, fromNodeId=node_id, toNodeId=repair.new_node_id
            )
    finally:
        for token in assumptions:
            cache.forget(pool_id, token)
