"""The fleet "now", counted in PostgreSQL for the gauges ``bc_reservations`` and ``bc_atoms``
(docs/metrics.md): reservations per pool and status, atoms per pool, class and state.

Both are one aggregate statement each, read at a scrape (the metrics module reuses the answer for
``BC_METRICS_GAUGE_TTL_SECONDS``). Every pool that is not archived gets every status and, for each class
it has, every state, with zero where nothing is counted, so a series exists before its first event.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.predicates import may_be_schedulable_sql
from app.db.tables import device_bookings, devices, nodes, pools, reservations

# every status a reservation can have (docs/lifecycle.md)
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
    into MIG slices is not an atom (its slices are); a dedicated node's atoms are free (for its tenant).

    Devices are counted per node first (a hash join of devices and the bookings holding them now; the
    exclusion constraint allows at most one such booking per device), then per pool over the node rows,
    where each node's schedulability is decided once, not once per atom (bench/observability.py: 0.14 to
    0.2 s for 80,000 atoms on this machine, against 1.1 s when each atom looked up its booking)."""
    child = devices.alias("child")
    usable = sa.and_(devices.c.healthy, devices.c.bookable)
    held_now = sa.and_(
        device_bookings.c.device_pk == devices.c.pk, device_bookings.c.during.contains(sa.func.now())
    )
    free_of_bookings = device_bookings.c.device_pk.is_(None)
    # WITH per_node AS (
    #   SELECT d.node_id, d.class, count(b.device_pk) AS booked,
    #          count(*) FILTER (WHERE b.device_pk IS NULL AND NOT (d.healthy AND d.bookable)) AS unhealthy,
    #          count(*) FILTER (WHERE b.device_pk IS NULL AND d.healthy AND d.bookable) AS usable
    #     FROM devices d LEFT JOIN device_bookings b ON b.device_pk = d.pk AND b.during @> now()
    #    WHERE NOT EXISTS (SELECT 1 FROM devices c WHERE c.node_id = d.node_id AND c.parent_id = d.id)
    #    GROUP BY d.node_id, d.class)
    # SELECT n.pool_id, pn.class, sum(booked), sum(unhealthy),
    #        sum(usable) FILTER (WHERE <may_be_schedulable(n)>), sum(usable) FILTER (WHERE NOT ...)
    #   FROM per_node pn JOIN nodes n ON n.id = pn.node_id JOIN pools p ON p.id = n.pool_id
    #  WHERE p.archived_at IS NULL GROUP BY n.pool_id, pn.class
    per_node = (
        sa.select(
            devices.c.node_id,
            devices.c["class"].label("cls"),
            sa.func.count(device_bookings.c.device_pk).label("booked"),
            sa.func.count().filter(sa.and_(free_of_bookings, ~usable)).label("unhealthy"),
            sa.func.count().filter(sa.and_(free_of_bookings, usable)).label("usable"),
        )
        .select_from(devices.outerjoin(device_bookings, held_now))
        .where(~sa.exists().where(child.c.node_id == devices.c.node_id, child.c.parent_id == devices.c.id))
        .group_by(devices.c.node_id, devices.c["class"])
        .cte("per_node")
    )
    schedulable = may_be_schedulable_sql()
    rows = (
        await conn.execute(
            sa.select(
                nodes.c.pool_id,
                per_node.c.cls,
                sa.func.sum(per_node.c.booked),
                sa.func.sum(per_node.c.unhealthy),
                sa.func.sum(per_node.c.usable).filter(schedulable),
                sa.func.sum(per_node.c.usable).filter(~schedulable),
            )
            .select_from(per_node.join(nodes, nodes.c.id == per_node.c.node_id).join(pools))
            .where(pools.c.archived_at.is_(None), nodes.c.deleted_at.is_(None))
            .group_by(nodes.c.pool_id, per_node.c.cls)
        )
    ).all()
    out: dict[tuple[str, str, str], int] = {}
    for pool, cls, booked, unhealthy, free, unschedulable in rows:
        counts = {"free": free, "booked": booked, "unhealthy": unhealthy, "unschedulable": unschedulable}
        for state in ATOM_STATES:
            out[(pool, cls, state)] = int(counts[state] or 0)
    return out
