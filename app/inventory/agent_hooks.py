"""Where BookingRepair and the wake edges connect to the agent paths (issue 12).

Hello, heartbeat and the liveness sweep call these in the SAME transaction as the change they report, after
the change is written and the node's NoSchedule reasons are refreshed, with the locks of the lock order
already held (pools -> nodes -> devices). Both count the edge (``bc_agent_edges_total{edge}``), log it and
send an edge (NOTIFY, :mod:`app.capacity.edges`) on ``conn``, so the edge commits or rolls back with its
cause: :func:`on_atoms_unavailable` sends the repair edge, on which BookingRepair moves the allocations
that book those atoms (ahead of any wake), :func:`on_node_may_fit` wakes the pool's pending reservations
(oldest first).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.edges import notify_node, notify_repair
from app.inventory.service import node_pool_id
from app.observability.metrics import AGENT_EDGES

log = logging.getLogger("better_compute.agents")

ATOMS_UNAVAILABLE = "atoms_unavailable"
NODE_MAY_FIT = "node_may_fit"


async def on_atoms_unavailable(conn: AsyncConnection, node_id: str, atom_ids: Sequence[str]) -> None:
    """Atoms ``atom_ids`` of ``node_id`` just turned unhealthy (heartbeat) or unbookable (left at Hello).

    Called in the transaction that made the change: sends the pool's repair edge, on which every replica
    runs BookingRepair (:mod:`app.capacity.repair_first`, ahead of any wake) once this transaction has
    committed: the work booked on these atoms for the rest of its window moves (same node, another node,
    or pending).
    """
    await notify_repair(conn, await node_pool_id(conn, node_id))  # BookingRepair runs on this edge
    AGENT_EDGES.labels(ATOMS_UNAVAILABLE).inc()
    log.info("node %s: atoms unavailable: %s", node_id, ", ".join(atom_ids))


async def on_node_may_fit(conn: AsyncConnection, pool_id: str, node_id: str) -> None:
    """``node_id`` in ``pool_id`` may fit more than before: created, a device added or back, health back,
    ``heartbeat lost`` or ``not ready`` cleared, or its system labels changed.

    Called in the transaction that made the change. Hook for issue 12's wake edge: wake the pool's pending
    reservations: NOTIFY on ``conn`` (heard by every replica when the transaction commits), sent only when
    the node is now schedulable for some tenant (only its dedicated tenant is woken when dedicated).
    """
    await notify_node(conn, node_id)
    AGENT_EDGES.labels(NODE_MAY_FIT).inc()
    log.info("pool %s: node %s may fit more work", pool_id, node_id)
