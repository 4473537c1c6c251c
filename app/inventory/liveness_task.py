"""The liveness sweep as a lifecycle task (app/capacity/controllers/lifecycle.py runs it every
``BC_NODE_LIVENESS_SWEEP_SECONDS`` in every service process; safe with several replicas): one pass is
one transaction per batch of :func:`app.inventory.liveness.sweep_heartbeats`, repeated while a batch
came back full.
"""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from app.inventory.liveness import SWEEP_BATCH, sweep_heartbeats

log = logging.getLogger("better_compute.liveness")
HEARTBEAT_LIVENESS = "heartbeat-liveness"  # the lifecycle task's name


async def sweep_once(engine: AsyncEngine, grace_seconds: float | None) -> int:
    """One sweep pass (batches until a short one), each batch its own transaction; returns nodes marked."""
    total = 0
    while True:
        async with engine.begin() as conn:
            now = (await conn.exec_driver_sql("SELECT now()")).scalar_one()
            marked = await sweep_heartbeats(conn, now, grace_seconds)
        total += marked
        if marked < SWEEP_BATCH:
            if total:
                log.warning("liveness: %d node(s) marked 'heartbeat lost'", total)
            return total
