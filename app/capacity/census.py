"""The fleet "now", counted in PostgreSQL for the gauges ``bc_reservations`` and ``bc_atoms``
(docs/metrics.md): reservations per pool and status, atoms per pool, class and state.

Both are one aggregate statement each, read at a scrape (the metrics module reuses the answer for
``BC_METRICS_GAUGE_TTL_SECONDS``). Every pool that is not archived gets every status and, for each class
it has, every state, with zero where nothing is counted, so a series exists before its first event.
"""

from __future__ import annotations

from collections import defaultdict

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.predicates import may_be_schedulable_sql
from app.db.tables import device_bookings, devices, nodes, pools, reservations

# every status a reservation can have (DESIGN.md, "Reservation lifecycle")
RESERVATION_STATUSES = ("queued", "pending", "placed", "released", "preempted", "ended")
# an atom's state now, in this precedence: booked (a booking holds it now, whatever else is true),
# unhealthy (unhealthy or unbookable), unschedulable (its node is schedulable for no tenant), free
ATOM_STATES = ("free", "booked", "unhealthy", "unschedulable")


async def reservation_counts(conn: AsyncConnection) -> dict[tuple[str, str], int]:
    """``{(pool_id, status): count}`` over every reservation, zero-filled for live pools."""
    # SELECT pool_id, status, count(*) FROM reservations GROUP BY pool_id, status
    counted = (
        await conn.execute(
            sa.select(reservations.c.pool_id, reservations.c.status, sa.func.count()).group_by(
                reservations.c.pool_id, reservations.c.status
            )
        )
    ).all()
    # SELECT id FROM pools WHERE archived_at IS NULL
    live = (await conn.execute(sa.select(pools.c.id).where(pools.c.archived_at.is_(None)))).scalars().all()
    out = {(pool, status): 0 for pool in live for status in RESERVATION_STATUSES}
    for pool, status, count in counted:
        out[(pool, status)] = count
    return out


async def atom_counts(conn: AsyncConnection) -> dict[tuple[str, str, str], int]:
    """``{(pool_id, class, state): count}`` over the atoms of live pools now (``ATOM_STATES``). A GPU split
    into MIG slices is not an atom (its slices are); a dedicated node's atoms are free (for its tenant)."""
    child = devices.alias("child")
    booked_now = (
        sa.exists()
        .where(device_bookings.c.device_pk == devices.c.pk, device_bookings.c.during.contains(sa.func.now()))
        .correlate(devices)
    )
    state = sa.case(
        (booked_now, "booked"),
        (~sa.and_(devices.c.healthy, devices.c.bookable), "unhealthy"),
        (~may_be_schedulable_sql(), "unschedulable"),
        else_="free",
    ).label("state")
    # SELECT n.pool_id, d.class, CASE
    #          WHEN EXISTS (SELECT 1 FROM device_bookings b WHERE b.device_pk = d.pk AND b.during @> now())
    #            THEN 'booked'
    #          WHEN NOT (d.healthy AND d.bookable) THEN 'unhealthy'
    #          WHEN NOT <may_be_schedulable(n)> THEN 'unschedulable'
    #          ELSE 'free' END AS state, count(*)
    #   FROM devices d JOIN nodes n ON n.id = d.node_id JOIN pools p ON p.id = n.pool_id
    #  WHERE p.archived_at IS NULL AND NOT EXISTS (SELECT 1 FROM devices c WHERE c.parent_id = d.id)
    #  GROUP BY 1, 2, 3
    rows = (
        await conn.execute(
            sa.select(nodes.c.pool_id, devices.c["class"], state, sa.func.count())
            .select_from(devices.join(nodes, nodes.c.id == devices.c.node_id).join(pools))
            .where(
                pools.c.archived_at.is_(None),
                ~sa.exists().where(child.c.parent_id == devices.c.id).correlate(devices),
            )
            .group_by(nodes.c.pool_id, devices.c["class"], state)
        )
    ).all()
    classes: dict[str, set[str]] = defaultdict(set)
    for pool, cls, _, _ in rows:
        classes[pool].add(cls)
    out = {(pool, cls, s): 0 for pool, seen in classes.items() for cls in seen for s in ATOM_STATES}
    for pool, cls, s, count in rows:
        out[(pool, cls, s)] = count
    return out
