"""The rows a node is written as: labels, devices, device links, scalar resources and its share of the
pool's capacity rollup, with the bounds checked before anything is written (docs/api.md, "Limits").
Used by the inventory service (create, import) and an agent's Hello (create and update), in the caller's
transaction and lock order (:mod:`app.db.locks`)."""

from __future__ import annotations

from decimal import Decimal

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.tables import (
    capacity_device_links,
    devices,
    node_labels,
    node_resources,
    nodes,
    pool_capacity_rollup,
)
from app.errors import Conflict, InvalidInput, quote_input
from app.inventory.importer import ImportedNode
from app.inventory.schemas import (
    MAX_DEVICES,
    MAX_LABELS,
    MAX_LINKS,
    DeviceBody,
    LinkBody,
    ResourceBody,
    TaintBody,
    jsonable_attributes,
)
from app.placement.scalar_capacity import scalar_capacity
from app.placement.system_labels import OPERATOR_SOURCE, SYSTEM_SOURCE, refuse_system_attributes


def dedupe_taints(taints: list[TaintBody]) -> list[TaintBody]:
    """``taints`` with one per (key, effect), the last given winning."""
    seen: dict[tuple[str, str], TaintBody] = {}
    for t in taints:
        seen[(t.key, t.effect)] = t
    return list(seen.values())


async def write_labels(
    conn: AsyncConnection, node_id: str, operator: dict[str, str], system: dict[str, str]
) -> None:
    """Insert a new node's ``operator`` and ``system`` labels (a system key wins); InvalidInput past
    MAX_LABELS (:func:`check_label_count`)."""
    rows = {k: {"node_id": node_id, "key": k, "value": v, "source": SYSTEM_SOURCE} for k, v in system.items()}
    for k, v in operator.items():
        if k in system:
            continue  # a system label is not overwritten by an operator's
        rows[k] = {"node_id": node_id, "key": k, "value": v, "source": OPERATOR_SOURCE}
    check_label_count(len(rows), len(system))
    if rows:
        await conn.execute(sa.insert(node_labels), list(rows.values()))


def check_device_count(devices: int, links: int) -> None:
    """Raise InvalidInput (path ``topo``) when imported text (an import, a Hello) lists more than
    MAX_DEVICES atoms or MAX_LINKS links on one node: the bounds of ``POST /v1/pools/{id}/nodes``
    (docs/api.md, "Limits"), checked before anything is built from them."""
    if devices > MAX_DEVICES:
        raise InvalidInput(
            f"a node holds at most {MAX_DEVICES} devices; the topo lists {devices}", path="topo"
        )
    if links > MAX_LINKS:
        raise InvalidInput(
            f"a node holds at most {MAX_LINKS} device links; the topo lists {links}", path="topo"
        )


def check_label_count(total: int, system: int) -> None:
    """Raise InvalidInput (path ``labels``) when a node would hold more than MAX_LABELS labels."""
    if total > MAX_LABELS:
        raise InvalidInput(
            f"a node holds at most {MAX_LABELS} labels ({total} with its {system} system "
            f"label{'' if system == 1 else 's'})",
            path="labels",
        )


async def insert_devices(conn: AsyncConnection, node_id: str, numbered: list[tuple[int, DeviceBody]]) -> None:
    """Insert ``(ordinal, device)`` rows on ``node_id``; Conflict (409) when an id is on another live node
    (a deleted node's devices gave their ids up: docs/operating.md, "Maintenance: drain and delete")."""
    if not numbered:
        return
    # SELECT d.id, n.id, n.name, n.pool_id FROM devices d JOIN nodes n ON n.id = d.node_id
    #  WHERE d.id = ANY(:ids) AND d.deleted_at IS NULL LIMIT 1  -- registered already: 409, nothing written
    taken = (
        await conn.execute(
            sa.select(devices.c.id, nodes.c.id.label("node_id"), nodes.c.name, nodes.c.pool_id)
            .select_from(devices.join(nodes, nodes.c.id == devices.c.node_id))
            .where(devices.c.id.in_([d.id for _, d in numbered]), devices.c.deleted_at.is_(None))
            .limit(1)
        )
    ).first()
    if taken is not None:
        raise Conflict(
            f"device {quote_input(taken.id)} is registered on node {taken.name} ({taken.node_id}) "
            f"of pool {taken.pool_id}",
            {"deviceId": taken.id, "nodeId": taken.node_id, "poolId": taken.pool_id},
        )
    await conn.execute(
        sa.insert(devices),
        [
            {
                "id": d.id,
                "node_id": node_id,
                "class": d.device_class,
                "attributes": jsonable_attributes(d.attributes),
                "numa_node": d.numaNode,
                "parent_id": d.parent,
                "healthy": d.healthy,
                "bookable": d.bookable,
                "ordinal": i,
            }
            for i, d in numbered
        ],
    )


async def write_devices(
    conn: AsyncConnection, node_id: str, device_list: list[DeviceBody], links: list[LinkBody]
) -> None:
    """Insert a new node's devices (in order) and its links, each pair once (lower id first)."""
    await insert_devices(conn, node_id, list(enumerate(device_list)))
    pairs: dict[tuple[str, str], str] = {}
    for link in links:
        a, b = sorted((link.a, link.b))
        pairs[(a, b)] = link.link
    if pairs:
        await conn.execute(
            sa.insert(capacity_device_links),
            [{"node_id": node_id, "a": a, "b": b, "link": kind} for (a, b), kind in sorted(pairs.items())],
        )


async def write_resources(conn: AsyncConnection, node_id: str, resources: dict[str, ResourceBody]) -> None:
    """Insert a new node's scalar resources (``allocatable``, ``ratio``)."""
    if resources:
        await conn.execute(
            sa.insert(node_resources),
            [
                {"node_id": node_id, "resource": name, "allocatable": r.allocatable, "ratio": r.ratio}
                for name, r in sorted(resources.items())
            ],
        )


async def add_rollup(
    conn: AsyncConnection, pool_id: str, device_list: list[DeviceBody], resources: dict[str, ResourceBody]
) -> None:
    """Add a new node's capacity to its pool's rollup: one per atom of each class, and each scalar's
    floor (``scalar_capacity``)."""
    totals: dict[str, Decimal] = {}
    for d in device_list:
        totals[d.device_class] = totals.get(d.device_class, Decimal(0)) + 1
    for name, r in resources.items():
        totals[name] = totals.get(name, Decimal(0)) + scalar_capacity(r.allocatable, r.ratio)
    await add_rollup_totals(conn, pool_id, totals)


async def add_rollup_totals(conn: AsyncConnection, pool_id: str, totals: dict[str, Decimal]) -> None:
    """Add ``totals`` (resource -> amount) to the pool's capacity rollup (last in the lock order)."""
    if not totals:
        return
    stmt = pg_insert(pool_capacity_rollup).values(
        [{"pool_id": pool_id, "resource": k, "total": v} for k, v in sorted(totals.items())]
    )
    await conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["pool_id", "resource"],
            set_={"total": pool_capacity_rollup.c.total + stmt.excluded.total},
        )
    )


def device_bodies(imported: ImportedNode) -> list[DeviceBody]:
    """The imported node's atoms as the device bodies :func:`app.inventory.service.add_node` stores
    (import and Hello, on create and update). A derived attribute under ``bc.dev/`` is refused (422, path
    ``nvidiaSmiXml.<i>.attributes.<key>``): the importer names attributes itself, so none should be."""
    refuse_system_attributes((d.attributes for d in imported.devices), path="nvidiaSmiXml")
    return [
        DeviceBody.model_validate(
            {
                "id": d.id,
                "class": d.device_class,
                "attributes": d.attributes,
                "numaNode": d.numa_node,
                "parent": d.parent,
                "bookable": d.bookable,
            }
        )
        for d in imported.devices
    ]
