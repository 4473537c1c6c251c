"""The reads behind the inventory service's answers: a pool's view (node count and capacity held now) as a
:class:`~app.answers.inventory.Pool` and a node's view (labels, taints, resources, devices, links) as a
:class:`~app.answers.inventory.Node`; the models in ``app/answers/inventory.py`` are the one definition of
their shapes (docs/api.md). Reads only, in the caller's transaction."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.answers.inventory import (
    CapacityRollup,
    Device,
    DrainState,
    Link,
    Node,
    NodeAgent,
    NodeResource,
    NodeSummary,
    Pool,
    Taint,
)
from app.db.tables import (
    capacity_device_links,
    device_bookings,
    devices,
    node_labels,
    node_resources,
    node_taints,
    nodes,
    pool_capacity_rollup,
)
from app.inventory.usage import drain_states, node_usage, scalars_held_now
from app.jsonnum import num


async def held_now(conn: AsyncConnection, pool_ids: list[str]) -> dict[tuple[str, str], Decimal]:
    """(pool id, resource) -> what is held now: atoms per class booked at ``now()`` and scalar holdings
    containing ``now()`` (capacity is counted per instant; the rollup keeps the totals only)::

        SELECT b.pool_id, d.class, count(*) FROM device_bookings b JOIN devices d ON d.pk = b.device_pk
         WHERE b.pool_id = ANY(:pools) AND b.during @> now() GROUP BY 1, 2;
        SELECT pool_id, resource, sum(amount) FROM scalar_holdings
         WHERE pool_id = ANY(:pools) AND starts_at <= now() AND ends_at > now() GROUP BY 1, 2;
    """
    held: dict[tuple[str, str], Decimal] = {}
    for r in (
        await conn.execute(
            sa.select(device_bookings.c.pool_id, devices.c["class"], sa.func.count())
            .join(devices, devices.c.pk == device_bookings.c.device_pk)
            .where(device_bookings.c.pool_id.in_(pool_ids), device_bookings.c.during.op("@>")(sa.func.now()))
            .group_by(device_bookings.c.pool_id, devices.c["class"])
        )
    ).all():
        held[(r[0], r[1])] = Decimal(r[2])
    for (pool_id, resource), amount in (await scalars_held_now(conn, "pool_id", pool_ids)).items():
        held[(pool_id, resource)] = held.get((pool_id, resource), Decimal(0)) + amount
    return held


async def pool_views(conn: AsyncConnection, rows: list[Any]) -> list[Pool]:
    """The views of ``rows`` (pools rows) in their order, ``capacity`` holding each resource's rollup
    ``total`` and what is held now as ``allocated`` (three queries)."""
    ids = [r.id for r in rows]
    counts: dict[str, int] = {}
    rollups: dict[str, dict[str, CapacityRollup]] = {i: {} for i in ids}
    if ids:
        counts = dict(
            (
                await conn.execute(
                    sa.select(nodes.c.pool_id, sa.func.count())
                    .where(nodes.c.pool_id.in_(ids), nodes.c.deleted_at.is_(None))
                    .group_by(nodes.c.pool_id)
                )
            ).all()
        )
        held = await held_now(conn, ids)
        for r in (
            await conn.execute(
                sa.select(pool_capacity_rollup)
                .where(pool_capacity_rollup.c.pool_id.in_(ids))
                .order_by(pool_capacity_rollup.c.resource)
            )
        ).all():
            rollups[r.pool_id][r.resource] = CapacityRollup(
                total=num(r.total), allocated=num(held.get((r.pool_id, r.resource), Decimal(0)))
            )
    return [
        Pool(
            id=row.id,
            name=row.name,
            createdAt=row.created_at.isoformat(),
            archivedAt=row.archived_at.isoformat() if row.archived_at else None,
            nodeCount=counts.get(row.id, 0),
            capacity=rollups[row.id],
        )
        for row in rows
    ]


def node_state(node: Any, drain: DrainState) -> dict[str, Any]:
    """A nodes row's state as :class:`~app.answers.inventory.Node` and
    :class:`~app.answers.inventory.NodeSummary` both answer it, with its ``drain``."""
    return {
        "cordoned": node.cordoned,
        "ready": node.ready,
        "heartbeatLost": node.heartbeat_lost,
        "noScheduleReasons": list(node.no_schedule_reasons),
        "drain": drain,
    }


async def node_view(conn: AsyncConnection, node: Any) -> Node:
    """The view of ``node`` (a nodes row) with its labels, taints, scalar resources (``allocated``: held
    now), devices and links: the shape of ``GET /v1/nodes/{nodeId}`` (docs/api.md)."""
    node_id = node.id
    labels = (
        await conn.execute(
            sa.select(node_labels).where(node_labels.c.node_id == node_id).order_by(node_labels.c.key)
        )
    ).all()
    taints = (
        await conn.execute(
            sa.select(node_taints).where(node_taints.c.node_id == node_id).order_by(node_taints.c.key)
        )
    ).all()
    resources = (
        await conn.execute(
            sa.select(node_resources)
            .where(node_resources.c.node_id == node_id)
            .order_by(node_resources.c.resource)
        )
    ).all()
    device_rows = (
        await conn.execute(
            sa.select(devices).where(devices.c.node_id == node_id).order_by(devices.c.ordinal, devices.c.id)
        )
    ).all()
    usage = (await node_usage(conn, [node_id]))[node_id]
    allocated = {u.resource: u.allocated for u in usage.scalars}  # held now
    drain = (await drain_states(conn, [node]))[node_id]
    links = (
        await conn.execute(
            sa.select(capacity_device_links)
            .where(capacity_device_links.c.node_id == node_id)
            .order_by(capacity_device_links.c.a, capacity_device_links.c.b)
        )
    ).all()
    return Node(
        id=node.id,
        poolId=node.pool_id,
        name=node.name,
        labels={r.key: r.value for r in labels},
        labelSources={r.key: r.source for r in labels},
        taints=[Taint(key=t.key, value=t.value, effect=t.effect) for t in taints],
        **node_state(node, drain),
        leasable=node.leasable,
        # the node's agent (None for a node registered by an operator): see app/inventory/hello.py
        agent=None
        if node.agent_interval_seconds is None
        else NodeAgent(
            intervalSeconds=node.agent_interval_seconds,
            lastHeartbeatAt=node.last_heartbeat_at.isoformat() if node.last_heartbeat_at else None,
            error=node.agent_error,
        ),
        resources={
            r.resource: NodeResource(
                allocatable=num(r.allocatable),
                ratio=num(r.ratio),
                allocated=allocated.get(r.resource, 0),
            )
            for r in resources
        },
        deviceClasses=usage.device_classes,
        scalars=usage.scalars,
        devices=[
            Device(
                id=d.id,
                device_class=d._mapping["class"],
                attributes=d.attributes,
                numaNode=d.numa_node,
                parent=d.parent_id,
                healthy=d.healthy,
                bookable=d.bookable,
                healthReason=d.health_reason,
            )
            for d in device_rows
        ],
        links=[Link(a=r.a, b=r.b, link=r.link) for r in links],
    )


async def node_summaries(conn: AsyncConnection, rows: list[Any]) -> list[NodeSummary]:
    """The summaries of ``rows`` (nodes rows with id, name, cordoned, ready, heartbeat_lost,
    last_heartbeat_at, no_schedule_reasons, draining) in their order, with labels, atoms counted by
    class, :func:`app.inventory.usage.node_usage` and the drain of the draining ones
    (:func:`app.inventory.usage.drain_states`; five statements for any number of nodes)."""
    ids = [r.id for r in rows]
    labels: dict[str, dict[str, str]] = {i: {} for i in ids}
    if ids:
        for r in (await conn.execute(sa.select(node_labels).where(node_labels.c.node_id.in_(ids)))).all():
            labels[r.node_id][r.key] = r.value
    usage = await node_usage(conn, ids)
    drains = await drain_states(conn, rows)
    return [
        NodeSummary(
            id=r.id,
            name=r.name,
            **node_state(r, drains[r.id]),
            lastHeartbeat=r.last_heartbeat_at.isoformat() if r.last_heartbeat_at else None,
            labels=dict(sorted(labels[r.id].items())),
            devices={u.device_class: u.total for u in usage[r.id].device_classes},
            deviceClasses=usage[r.id].device_classes,
            scalars=usage[r.id].scalars,
        )
        for r in rows
    ]
