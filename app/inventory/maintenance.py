"""Node maintenance (docs/operating.md, "Maintenance: drain and delete"): drain, undrain and delete.

- :func:`set_drain` marks a node draining (the NoSchedule reason ``draining``: no new work of any kind,
  whole-node leases included, lands on it) or lifts it; work already placed keeps its window. What a
  drain does to future work (its planned windows dropped, with ``reschedule`` its future reservations
  moved) is the capacity service's, run after this commits (:mod:`app.capacity.controllers.drain`). The
  node's ``drain`` reads ``draining`` or ``drained`` (:func:`app.inventory.usage.drain_states`).
- :func:`delete_node` archives a node that holds nothing current or future: the row stays as the
  history of its allocations (a past reservation still names its node), hidden from every read of the
  pool (lists, counts, placement, occupancy) and from ``GET /v1/nodes/{id}`` (404); its name and its
  device ids are free for a new node (its devices stay, ``deleted_at`` set, as the history of their
  bookings: a past reservation, usage and audit still name them).

Both take the engine (their own transaction) or a connection (the caller's).
"""

from __future__ import annotations

from decimal import Decimal

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.answers.inventory import Node
from app.capacity.edges import notify_node
from app.db.locks import lock_node, lock_node_in_order, lock_pool
from app.db.tables import devices, node_resources, nodes
from app.db.tx import transaction
from app.errors import Conflict
from app.inventory.node_rows import add_rollup_totals
from app.inventory.service import bump_inventory_version, get_node, node_pool_id, refresh_reasons
from app.inventory.usage import busy_allocations_sql
from app.observability.metrics import NODE_MAINTENANCE
from app.placement.scalar_capacity import scalar_capacity

NAMED_IN_CONFLICT = 5  # reservation ids a refused delete names


@transaction
async def set_drain(conn: AsyncConnection, node_id: str, draining: bool) -> Node:
    """Drain (``draining``) or undrain a node: its NoSchedule reasons change in the same transaction;
    idempotent. Undrain sends the node's wake edge (as uncordon). NotFound (404) for no node."""
    await lock_node_in_order(conn, node_id)
    await conn.execute(sa.update(nodes).where(nodes.c.id == node_id).values(draining=draining))
    await refresh_reasons(conn, node_id)
    if not draining:
        await notify_node(conn, node_id)  # wake edge: undrain (sent only if now schedulable)
    NODE_MAINTENANCE.labels("drain" if draining else "undrain").inc()
    return await get_node(conn, node_id)


@transaction
async def delete_node(conn: AsyncConnection, node_id: str) -> None:
    """Delete a node that holds no current or future allocation (a drained node holds none).

    Refused with :class:`~app.errors.Conflict` (409 ``CONFLICT``, nothing changed) while it does: the
    message names up to five reservations and how many there are, ``details`` ``{nodeId,
    reservationIds, count}``. Else the node row is archived (``deleted_at``; drained, its agent
    forgotten), its devices too (``deleted_at``: they stay as the history of their bookings, and their
    ids are free for a new registration of the host, by Hello or import), its capacity leaves the pool's
    rollup and the pool's inventory version is bumped. NotFound (404) for no node or one deleted already.

    Locks: the pool ``FOR NO KEY UPDATE`` (an inventory change, waiting for the commits in flight),
    then the node, its devices (the UPDATE), and the rollup last (the lock order)."""
    pool_id = await node_pool_id(conn, node_id)
    await lock_pool(conn, pool_id)
    await lock_node(conn, node_id)
    busy = [r.reservation_id for r in (await conn.execute(busy_allocations_sql([node_id]))).all()]
    if busy:
        ids = list(dict.fromkeys(busy))
        named = ", ".join(ids[:NAMED_IN_CONFLICT]) + (", ..." if len(ids) > NAMED_IN_CONFLICT else "")
        NODE_MAINTENANCE.labels("delete_refused").inc()
        raise Conflict(
            f"node {node_id} holds current or future work of {len(ids)} reservation"
            f"{'s' if len(ids) != 1 else ''} ({named}): drain it (with reschedule to move future work) "
            "and wait until it is drained, or release them",
            {"nodeId": node_id, "reservationIds": ids[:NAMED_IN_CONFLICT], "count": len(ids)},
        )
    await conn.execute(sa.update(nodes).where(nodes.c.id == node_id).values(draining=True))
    await refresh_reasons(conn, node_id)  # draining: every guarded commit refuses it from now on
    await conn.execute(
        sa.update(nodes)
        .where(nodes.c.id == node_id)
        .values(deleted_at=sa.func.now(), agent_interval_seconds=None)
    )
    # UPDATE devices SET deleted_at = now() WHERE node_id = :node   -- their ids free for a live device
    await conn.execute(
        sa.update(devices).where(devices.c.node_id == node_id).values(deleted_at=sa.func.now())
    )
    totals: dict[str, Decimal] = {}
    for device_class, count in (
        await conn.execute(
            sa.select(devices.c["class"], sa.func.count())
            .where(devices.c.node_id == node_id)
            .group_by(devices.c["class"])
        )
    ).all():
        totals[device_class] = Decimal(-count)
    for r in (await conn.execute(sa.select(node_resources).where(node_resources.c.node_id == node_id))).all():
        totals[r.resource] = totals.get(r.resource, Decimal(0)) - scalar_capacity(r.allocatable, r.ratio)
    await add_rollup_totals(conn, pool_id, totals)
    await bump_inventory_version(conn, pool_id)
    NODE_MAINTENANCE.labels("delete").inc()
