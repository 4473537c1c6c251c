"""Liveness of agents' nodes: ``heartbeat lost`` after the grace period without a heartbeat.

Source rule: issue 14 / docs/agent.md. A node that has sent Hello (its
``agent_interval_seconds`` is set) and whose last Hello or heartbeat is older than the grace period
(``BC_NODE_HEARTBEAT_GRACE`` seconds, or 3 x the interval its Hello carried) gets the NoSchedule reason
``heartbeat lost`` in the same transaction as the check. The next good heartbeat or Hello clears it
(:mod:`app.inventory.hello`). Work booked on a lost node stays booked: a lost heartbeat is not a failed
GPU (``docs/agent.md`` has the operator's choices).

Safe with several replicas: each sweep claims the overdue nodes ``FOR UPDATE SKIP LOCKED``, so two
replicas never mark one node twice and never wait on each other (or on a Hello/heartbeat holding a node).
Only node rows are locked, in id order, and nothing later in the lock order: no deadlock with the
transactions that lock pools -> nodes.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.tables import node_taints, nodes
from app.inventory.reasons import no_schedule_reasons
from app.observability.metrics import HEARTBEATS_LOST

GRACE_INTERVALS = 3  # default grace: this many heartbeat intervals
SWEEP_BATCH = 500


async def sweep_heartbeats(
    conn: AsyncConnection, now: datetime, grace_seconds: float | None = None, batch: int = SWEEP_BATCH
) -> int:
    """Mark up to ``batch`` overdue agents' nodes ``heartbeat lost`` (reasons refreshed) in ``conn``'s
    transaction; returns how many. ``now`` is the database clock; ``grace_seconds`` None means
    ``GRACE_INTERVALS`` x each node's own interval. The caller commits."""
    grace = (
        sa.func.make_interval(0, 0, 0, 0, 0, 0, grace_seconds)
        if grace_seconds is not None
        else sa.func.make_interval(0, 0, 0, 0, 0, 0, nodes.c.agent_interval_seconds * GRACE_INTERVALS)
    )
    # SELECT id, cordoned, ready, draining FROM nodes
    #  WHERE agent_interval_seconds IS NOT NULL AND NOT heartbeat_lost      -- ix_nodes_agent_heartbeat
    #    AND last_heartbeat_at < :now - <grace>
    #  ORDER BY id LIMIT :batch FOR UPDATE SKIP LOCKED
    overdue = (
        await conn.execute(
            sa.select(nodes.c.id, nodes.c.cordoned, nodes.c.ready, nodes.c.draining)
            .where(
                nodes.c.agent_interval_seconds.is_not(None),
                sa.not_(nodes.c.heartbeat_lost),
                nodes.c.last_heartbeat_at < sa.literal(now) - grace,
            )
            .order_by(nodes.c.id)
            .limit(batch)
            .with_for_update(skip_locked=True)
        )
    ).all()
    if not overdue:
        return 0
    taints: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for r in (
        await conn.execute(
            sa.select(
                node_taints.c.node_id, node_taints.c.key, node_taints.c.value, node_taints.c.effect
            ).where(node_taints.c.node_id.in_([n.id for n in overdue]))
        )
    ).all():
        taints[r.node_id].append((r.key, r.value, r.effect))
    for n in overdue:
        await conn.execute(
            sa.update(nodes)
            .where(nodes.c.id == n.id)
            .values(
                heartbeat_lost=True,
                no_schedule_reasons=no_schedule_reasons(
                    n.cordoned, n.ready, True, taints[n.id], draining=n.draining
                ),
            )
        )
    HEARTBEATS_LOST.inc(len(overdue))
    return len(overdue)
