"""The periodic runner of the liveness sweep (one per service process; safe with several replicas).

Kept tiny and separate from :func:`app.inventory.liveness.sweep_heartbeats` so it can move under the
lifecycle controller's registry: ``run_liveness(engine, period, grace)`` is a coroutine that sweeps every
``period`` seconds (each sweep one transaction, repeated while a batch came back full) until cancelled.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from app.inventory.liveness import SWEEP_BATCH, sweep_heartbeats

log = logging.getLogger("better_compute.liveness")


async def sweep_once(engine: AsyncEngine, grace_seconds: float | None) -> int:
    """One sweep pass (batches until a short one), each batch its own transaction; returns nodes marked."""
    total = 0
    while True:
        async with engine.begin() as conn:
            now = (await conn.exec_driver_sql("SELECT now()")).scalar_one()
            marked = await sweep_heartbeats(conn, now, grace_seconds)
        total += marked
        if marked < SWEEP_BATCH:
            return total


async def run_liveness(engine: AsyncEngine, period_seconds: float, grace_seconds: float | None) -> None:
    """Sweep every ``period_seconds`` until cancelled; a failed sweep (database down) is logged and retried
    at the next period."""
    while True:
        try:
            marked = await sweep_once(engine, grace_seconds)
            if marked:
                log.warning("liveness: %d node(s) marked 'heartbeat lost'", marked)
        except asyncio.CancelledError:
            raise
        except Exception:  # the database may be restarting: try again next period
            log.exception("liveness sweep failed")
        await asyncio.sleep(period_seconds)
