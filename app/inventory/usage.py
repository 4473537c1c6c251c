"""What nodes' atoms and scalar resources hold at the database's now, class by class and resource by
resource: the ``deviceClasses`` and ``scalars`` of ``GET /v1/pools/{id}/nodes`` and ``GET /v1/nodes/{id}``
(docs/api.md, "Inventory"). Three set-based statements for any number of nodes; and a node's ``drain``
(what is placed on it now or later, docs/operating.md "Maintenance: drain and delete"). Reads only, in
the caller's transaction."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.answers.inventory import DeviceClassUsage, ScalarUsage
from app.db.tables import allocations, device_bookings, devices, node_resources, scalar_holdings
from app.db.windows import held_at
from app.jsonnum import num
from app.placement.scalar_capacity import scalar_capacity


@dataclass
class NodeUsage:
    """One node's usage now: atoms by class (sorted), scalar resources by name (sorted)."""

    device_classes: list[DeviceClassUsage] = field(default_factory=list)
    scalars: list[ScalarUsage] = field(default_factory=list)


async def node_usage(conn: AsyncConnection, node_ids: list[str]) -> dict[str, NodeUsage]:
    """node id -> its :class:`NodeUsage` (every id of ``node_ids``; a node without atoms or scalars has
    empty lists)::

        SELECT d.node_id, d.class, count(*), count(b.device_pk),
               count(*) FILTER (WHERE d.healthy AND d.bookable AND b.device_pk IS NULL),
               count(*) FILTER (WHERE NOT d.healthy)
          FROM devices d LEFT JOIN device_bookings b ON b.device_pk = d.pk AND b.during @> now()
         WHERE d.node_id = ANY(:ids) GROUP BY 1, 2 ORDER BY 1, 2;
        SELECT * FROM node_resources WHERE node_id = ANY(:ids) ORDER BY node_id, resource;
        SELECT node_id, resource, sum(amount) FROM scalar_holdings
         WHERE node_id = ANY(:ids) AND starts_at <= now() AND ends_at > now() GROUP BY 1, 2

    An atom has at most one booking at an instant (the bookings' exclusion constraint), so the join
    counts each booked atom once."""
    usage = {node_id: NodeUsage() for node_id in node_ids}
    if not node_ids:
        return usage
    booked = device_bookings.c.device_pk
    free = sa.and_(devices.c.healthy, devices.c.bookable, booked.is_(None))
    for r in (
        await conn.execute(
            sa.select(
                devices.c.node_id,
                devices.c["class"].label("device_class"),
                sa.func.count().label("total"),
                sa.func.count(booked).label("allocated"),
                sa.func.count().filter(free).label("free"),
                sa.func.count().filter(sa.not_(devices.c.healthy)).label("unhealthy"),
            )
            .select_from(
                devices.outerjoin(
                    device_bookings,
                    sa.and_(booked == devices.c.pk, device_bookings.c.during.op("@>")(sa.func.now())),
                )
            )
            .where(devices.c.node_id.in_(node_ids))
            .group_by(devices.c.node_id, devices.c["class"])
            .order_by(devices.c.node_id, devices.c["class"])
        )
    ).all():
        # the statement labels its counts as the answer's fields
        usage[r.node_id].device_classes.append(DeviceClassUsage.model_validate(r, from_attributes=True))
    held = await scalars_held_now(conn, "node_id", node_ids)
    for r in (
        await conn.execute(
            sa.select(node_resources)
            .where(node_resources.c.node_id.in_(node_ids))
            .order_by(node_resources.c.node_id, node_resources.c.resource)
        )
    ).all():
        capacity = scalar_capacity(r.allocatable, r.ratio)
        allocated = held.get((r.node_id, r.resource), Decimal(0))
        usage[r.node_id].scalars.append(
            ScalarUsage(
                resource=r.resource,
                capacity=num(capacity),
                allocated=num(allocated),
                free=num(max(capacity - allocated, Decimal(0))),
            )
        )
    return usage


async def scalars_held_now(
    conn: AsyncConnection, holder: str, holder_ids: list[str]
) -> dict[tuple[str, str], Decimal]:
    """``(holder id, resource)`` -> the scalar amounts held at the database's now, ``holder`` being
    ``node_id`` (by node) or ``pool_id`` (by pool)::

        SELECT <holder>, resource, sum(amount) FROM scalar_holdings
         WHERE <holder> = ANY(:ids) AND starts_at <= now() AND ends_at > now() GROUP BY 1, 2
    """
    column = scalar_holdings.c[holder]
    return await held_at(
        conn, scalar_holdings, [column.in_(holder_ids)], sa.func.now(), [column, scalar_holdings.c.resource]
    )


# a node's ``drain`` (docs/operating.md, "Maintenance: drain and delete")
DRAINING, DRAINED = "draining", "drained"


def busy_allocations_sql(node_ids: list[str]) -> sa.Select[tuple[str, str, str]]:
    """The allocations placed on ``node_ids`` that are current or future at the database's now (not
    released, window not over; planned windows of pending reservations too), rows ``(node_id,
    reservation_id, allocation id)`` by node, then start::

        SELECT node_id, reservation_id, id FROM allocations
         WHERE node_id = ANY(:ids) AND released_at IS NULL AND upper(during) > now()
         ORDER BY node_id, lower(during), reservation_id
    """
    return (
        sa.select(allocations.c.node_id, allocations.c.reservation_id, allocations.c.id)
        .where(
            allocations.c.node_id.in_(node_ids),
            allocations.c.released_at.is_(None),
            sa.func.upper(allocations.c.during) > sa.func.now(),
        )
        .order_by(allocations.c.node_id, sa.func.lower(allocations.c.during), allocations.c.reservation_id)
    )


async def drain_states(conn: AsyncConnection, rows: list[Any]) -> dict[str, str | None]:
    """node id -> its ``drain`` for ``rows`` (nodes rows with ``id`` and ``draining``): ``draining``
    while something placed on it is current or future (:func:`busy_allocations_sql`), ``drained`` once
    nothing is, ``None`` for a node that is not drained. One statement, only for the draining nodes."""
    draining = [r.id for r in rows if r.draining]
    busy: set[str] = set()
    if draining:
        busy = {r.node_id for r in (await conn.execute(busy_allocations_sql(draining))).all()}
    return {r.id: (DRAINING if r.id in busy else DRAINED) if r.draining else None for r in rows}
