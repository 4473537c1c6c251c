"""Inventory service: pools, nodes, devices, labels, taints, cordon, health, device links.

Every change that alters a pool's static inventory (nodes, devices, links, labels) bumps
``pools.inventory_version`` in the same transaction, so every replica's pool cache sees it on its next
request. Locks are taken in the one lock order of :mod:`app.db.locks`.

Entry points (decorated :func:`~app.db.tx.transaction` or :func:`~app.db.tx.reads`) take the engine and
open their own transaction, or a connection and join the caller's (an agent's Hello, a race test).
They answer the models of :mod:`app.answers.inventory` (:class:`~app.answers.inventory.Pool`,
:class:`~app.answers.inventory.Node`, ...), built by :mod:`app.inventory.views`; a router returns them
as they are, or puts a page of them in its list envelope (docs/api.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from app.answers.inventory import ImportedNode, Node, NodeSummary, Pool
from app.capacity.edges import notify_node, notify_repair
from app.db.locks import (
    lock_node,
    lock_node_in_order,
    lock_pool,
    node_row,
    pool_not_found,
    pool_of_node,
)
from app.db.tables import (
    devices,
    node_labels,
    node_taints,
    nodes,
    pools,
)
from app.db.tx import reads, transaction
from app.errors import Conflict, InvalidInput, PoolArchived, quote_input
from app.ids import new_id
from app.inventory.importer import build_imported_node
from app.inventory.node_rows import (
    add_rollup,
    check_device_count,
    check_label_count,
    dedupe_taints,
    device_bodies,
    write_devices,
    write_labels,
    write_resources,
)
from app.inventory.reasons import no_schedule_reasons
from app.inventory.schemas import (
    HealthBody,
    LinkBody,
    NodeCreate,
    NodeImport,
    TaintBody,
)
from app.inventory.views import node_summaries, node_view, pool_views
from app.placement.system_labels import (
    OPERATOR_SOURCE,
    SYSTEM_SOURCE,
    refuse_system_attributes,
    refuse_system_keys,
)

# --------------------------------------------------------------------------------------------- pools


@transaction
async def create_pool(conn: AsyncConnection, name: str) -> Pool:
    """Create a pool; raises :class:`~app.errors.Conflict` when the name is taken."""
    pool_id = new_id("pool")
    row = (
        await conn.execute(
            pg_insert(pools)
            .values(id=pool_id, name=name)
            .on_conflict_do_nothing(index_elements=["name"])
            .returning(pools.c.id)
        )
    ).first()
    if row is None:
        raise Conflict(f"a pool named {name} exists", {"name": name})
    return await get_pool(conn, pool_id)


@reads
async def list_pools(conn: AsyncConnection) -> list[Pool]:
    """Every pool, oldest first, with node counts and capacity rollup (three queries in all)."""
    rows = (await conn.execute(sa.select(pools).order_by(pools.c.created_at, pools.c.id))).all()
    return await pool_views(conn, rows)


@reads
async def get_pool(conn: AsyncConnection, pool_id: str) -> Pool:
    """The pool with its node count and capacity rollup (``allocated``: held now); NotFound if absent."""
    return (await pool_views(conn, [await get_pool_row(conn, pool_id)]))[0]


async def bump_inventory_version(conn: AsyncConnection, pool_id: str) -> None:
    """``UPDATE pools SET inventory_version = inventory_version + 1`` (locks the pool row)."""
    await conn.execute(
        sa.update(pools).where(pools.c.id == pool_id).values(inventory_version=pools.c.inventory_version + 1)
    )


@transaction
async def archive_pool(conn: AsyncConnection, pool_id: str) -> Pool:
    """Archive a pool: nothing new is placed in it; existing reservations stay until released."""
    await lock_pool(conn, pool_id)
    await conn.execute(
        sa.update(pools)
        .where(pools.c.id == pool_id, pools.c.archived_at.is_(None))
        .values(archived_at=sa.func.now(), inventory_version=pools.c.inventory_version + 1)
    )
    return await get_pool(conn, pool_id)


def refuse_archived(pool: Any) -> None:
    """The one refusal of a new node in an archived ``pool`` (a pools row): :class:`~app.errors.PoolArchived`
    (409 ``POOL_ARCHIVED``), ``pool '<id>' is archived``, details ``{poolId}``."""
    if pool.archived_at is not None:
        raise PoolArchived(f"pool {quote_input(pool.id)} is archived", {"poolId": pool.id})


# --------------------------------------------------------------------------------------------- nodes


@transaction
async def add_node(
    conn: AsyncConnection,
    pool_id: str,
    body: NodeCreate,
    system_labels: dict[str, str] | None = None,
) -> Node:
    """Register a node with its labels, taints, scalar resources, devices (atoms) and links.

    ``body.labels`` are operator labels: a ``bc.dev/`` key among them is refused with InvalidInput (422,
    path ``labels.<key>``) before anything is written; only ``system_labels`` (from the importer or an
    agent's Hello) are stored with source ``system``. A ``bc.dev/`` device attribute is refused alike
    (422, path ``devices.<i>.attributes.<key>``; docs/selectors.md). Raises NotFound (pool), PoolArchived
    (409, an archived pool: :func:`refuse_archived`), Conflict (duplicate node name or device id).
    """
    refuse_system_keys(body.labels)
    refuse_system_attributes(d.attributes for d in body.devices)
    refuse_archived(await lock_pool(conn, pool_id))
    node_id = new_id("node")
    taints = [(t.key, t.value, t.effect) for t in body.taints]
    inserted = (
        await conn.execute(
            pg_insert(nodes)
            .values(
                id=node_id,
                pool_id=pool_id,
                name=body.name,
                cordoned=body.cordoned,
                leasable=body.leasable,
                no_schedule_reasons=no_schedule_reasons(body.cordoned, True, False, taints, draining=False),
            )
            .on_conflict_do_nothing(
                index_elements=["pool_id", "name"], index_where=nodes.c.deleted_at.is_(None)
            )
            .returning(nodes.c.id)
        )
    ).first()
    if inserted is None:
        raise Conflict(f"pool {pool_id} already has a node named {body.name}", {"name": body.name})
    await write_labels(conn, node_id, body.labels, system_labels or {})
    if body.taints:
        await conn.execute(
            sa.insert(node_taints),
            [
                {"node_id": node_id, "key": t.key, "value": t.value, "effect": t.effect}
                for t in dedupe_taints(body.taints)
            ],
        )
    await write_devices(conn, node_id, body.devices, body.links)
    await write_resources(conn, node_id, body.resources)
    await add_rollup(conn, pool_id, body.devices, body.resources)
    await bump_inventory_version(conn, pool_id)
    await notify_node(conn, node_id)  # wake edge: a new candidate for the pool's pending reservations
    return await get_node(conn, node_id)


@transaction
async def import_node(conn: AsyncConnection, pool_id: str, body: NodeImport) -> ImportedNode:
    """Register a node from real ``nvidia-smi topo -m`` text (and optionally ``nvidia-smi -q -x`` XML).

    GPUs become atoms (UUIDs with XML, ``<name>-GPU<i>`` without); GPU-GPU links go to
    ``capacity_device_links``; hardware-derived labels are stored with source ``system``. The answer is
    the node view plus ``warnings``: topo cells outside the GPU x GPU block that were malformed and left out.
    Raises InvalidInput(path ``topo`` / ``nvidiaSmiXml``) for text that does not parse.
    """
    imported = build_imported_node(body.name, body.topo, body.nvidiaSmiXml)
    check_device_count(len(imported.devices), len(imported.links))
    node = NodeCreate(
        name=body.name,
        labels=body.labels,
        taints=body.taints,
        resources=body.resources,
        devices=device_bodies(imported),
        links=[LinkBody(a=a, b=b, link=kind) for a, b, kind in imported.links],
    )
    view = await add_node(conn, pool_id, node, system_labels=dict(imported.labels))
    # malformed cells outside the GPU x GPU block were left out: say which (never a refusal)
    return ImportedNode(**dict(view), warnings=list(imported.warnings))


@dataclass(frozen=True)
class NodePage:
    """A page of :func:`list_nodes`: ``next`` is the id to pass as ``after`` for the next page, ``None``
    on the last page (the router turns it into a cursor)."""

    items: list[NodeSummary]
    next: str | None


@reads
async def list_nodes(
    conn: AsyncConnection, pool_id: str, limit: int = 1000, after: str | None = None
) -> NodePage:
    """A page of up to ``limit`` of the pool's nodes in id order after the id ``after``, each with its
    labels, its atoms counted by class and what its atoms and scalars hold now
    (:func:`app.inventory.views.node_summaries`: set-based, no read per node); NotFound for no pool."""
    await get_pool_row(conn, pool_id)
    stmt = sa.select(
        nodes.c.id,
        nodes.c.name,
        nodes.c.cordoned,
        nodes.c.ready,
        nodes.c.heartbeat_lost,
        nodes.c.last_heartbeat_at,
        nodes.c.no_schedule_reasons,
        nodes.c.draining,
    ).where(nodes.c.pool_id == pool_id, nodes.c.deleted_at.is_(None))
    if after is not None:
        stmt = stmt.where(nodes.c.id > after)
    rows = (await conn.execute(stmt.order_by(nodes.c.id).limit(limit + 1))).all()
    page, more = rows[:limit], len(rows) > limit
    return NodePage(await node_summaries(conn, page), page[-1].id if more else None)


async def get_pool_row(conn: AsyncConnection, pool_id: str) -> Any:
    """The pool row (no lock); NotFound if absent."""
    row = (await conn.execute(sa.select(pools).where(pools.c.id == pool_id))).first()
    if row is None:
        raise pool_not_found(pool_id)
    return row


@reads
async def node_pool_id(conn: AsyncConnection, node_id: str) -> str:
    """The pool a node belongs to, for authorization (:func:`app.db.locks.pool_of_node`); NotFound if
    absent."""
    return await pool_of_node(conn, node_id)


@reads
async def get_node(conn: AsyncConnection, node_id: str) -> Node:
    """The node view (:func:`app.inventory.views.node_view`); NotFound if absent."""
    return await node_view(conn, await node_row(conn, node_id))


async def refresh_reasons(conn: AsyncConnection, node_id: str) -> None:
    """Recompute ``no_schedule_reasons`` from the node's locked row and taints (same transaction)."""
    node = await node_row(conn, node_id)
    taints = (
        await conn.execute(
            sa.select(node_taints.c.key, node_taints.c.value, node_taints.c.effect).where(
                node_taints.c.node_id == node_id
            )
        )
    ).all()
    reasons = no_schedule_reasons(
        node.cordoned, node.ready, node.heartbeat_lost, [tuple(t) for t in taints], draining=node.draining
    )
    await conn.execute(sa.update(nodes).where(nodes.c.id == node_id).values(no_schedule_reasons=reasons))


@transaction
async def set_cordon(conn: AsyncConnection, node_id: str, cordoned: bool) -> Node:
    """Cordon or uncordon a node; its NoSchedule reasons change in the same transaction."""
    await lock_node_in_order(conn, node_id)
    await conn.execute(sa.update(nodes).where(nodes.c.id == node_id).values(cordoned=cordoned))
    await refresh_reasons(conn, node_id)
    if not cordoned:
        await notify_node(conn, node_id)  # wake edge: uncordon
    return await get_node(conn, node_id)


@transaction
async def set_taints(conn: AsyncConnection, node_id: str, taints: list[TaintBody]) -> Node:
    """Replace the node's taints (``dedicated=<tenant>`` NoSchedule dedicates it to that tenant)."""
    await lock_node_in_order(conn, node_id)
    await conn.execute(sa.delete(node_taints).where(node_taints.c.node_id == node_id))
    if taints:
        await conn.execute(
            sa.insert(node_taints),
            [
                {"node_id": node_id, "key": t.key, "value": t.value, "effect": t.effect}
                for t in dedupe_taints(taints)
            ],
        )
    await refresh_reasons(conn, node_id)
    await notify_node(conn, node_id)  # wake edge: a taint removed (sent only if now schedulable)
    return await get_node(conn, node_id)


@transaction
async def set_labels(conn: AsyncConnection, node_id: str, labels: dict[str, str]) -> Node:
    """Replace the node's operator labels; system labels stay. Bumps the pool's inventory version.

    Refused with InvalidInput (422, path ``labels.<key>``, nothing changed): a ``bc.dev/`` key (only
    Hello writes those), and a key the node already carries as a system label (written by its import or
    its agent's Hello, such as ``gpu.count``), which an operator label cannot replace (docs/api.md)."""
    refuse_system_keys(labels)
    pool_id = await node_pool_id(conn, node_id)
    await bump_inventory_version(conn, pool_id)  # locks the pool row first (lock order)
    await lock_node(conn, node_id)
    system = set(
        (
            await conn.execute(
                sa.select(node_labels.c.key).where(
                    node_labels.c.node_id == node_id, node_labels.c.source == SYSTEM_SOURCE
                )
            )
        ).scalars()
    )
    taken = next((key for key in labels if key in system), None)
    if taken is not None:  # raising rolls the transaction back: the version bump above is undone too
        raise InvalidInput(
            f"label {taken} is a system label of node {node_id} (from its import or its agent's Hello): "
            "an operator label cannot replace it",
            path=f"labels.{taken}",
            details={"key": taken},
        )
    await conn.execute(
        sa.delete(node_labels).where(
            node_labels.c.node_id == node_id, node_labels.c.source == OPERATOR_SOURCE
        )
    )
    rows = [{"node_id": node_id, "key": k, "value": v, "source": OPERATOR_SOURCE} for k, v in labels.items()]
    check_label_count(len(rows) + len(system), len(system))
    if rows:
        await conn.execute(sa.insert(node_labels), rows)
    await notify_node(conn, node_id)  # wake edge: labels changed
    return await get_node(conn, node_id)


def _given(**columns: Any) -> dict[str, Any]:
    """The columns a body sets: those not ``None`` (``None`` leaves the stored value)."""
    return {name: value for name, value in columns.items() if value is not None}


@transaction
async def set_health(conn: AsyncConnection, node_id: str, body: HealthBody) -> Node:
    """Record node conditions (ready, heartbeat) and per-atom health/bookability."""
    node = await lock_node_in_order(conn, node_id)
    values = _given(ready=body.ready, heartbeat_lost=body.heartbeatLost)
    if values:
        await conn.execute(sa.update(nodes).where(nodes.c.id == node.id).values(**values))
    known = set(
        (await conn.execute(sa.select(devices.c.id).where(devices.c.node_id == node_id))).scalars().all()
    )
    for i, d in enumerate(body.devices):
        if d.id not in known:
            raise InvalidInput(f"device {d.id} is not on node {node_id}", path=f"devices.{i}.id")
    unavailable = [d.id for d in body.devices if d.healthy is False or d.bookable is False]
    for d in sorted(body.devices, key=lambda x: x.id):
        change = _given(healthy=d.healthy, bookable=d.bookable)
        if change:
            await conn.execute(
                sa.update(devices).where(devices.c.node_id == node_id, devices.c.id == d.id).values(**change)
            )
    await refresh_reasons(conn, node_id)
    await notify_node(conn, node_id)  # wake edge: health restored (sent only if now schedulable)
    if (
        unavailable
    ):  # BookingRepair runs on this edge, ahead of any wake (app.capacity.controllers.repair_first)
        await notify_repair(conn, node.pool_id)
    return await get_node(conn, node_id)
