"""Repair first (docs/lifecycle.md, "Repair first"): BookingRepair runs on its own lifecycle task, ahead
of the wakes of pending reservations and of their sweep, never behind them.

Before, the wake task ran BookingRepair at the start of each wake run, so an atom marked unhealthy while
a run was waking hundreds of pending reservations (one transaction each) stayed booked until that run
ended: seconds with a backlog. Now:

- **its own edge and listener.** An atom that turns unhealthy or unbookable sends the repair edge
  (``NOTIFY bc_repair, <pool id>``, :func:`app.capacity.edges.notify_repair`) in the
  transaction that
  made it so. :class:`RepairController` LISTENs on ``bc_repair`` on its own connection and pokes its
  own task (``booking-repair``), which runs :func:`app.capacity.controllers.repair.repair_broken` at once,
  whatever
  the wake task is doing. The task also runs every ``interval`` seconds (``BC_LIFECYCLE_INTERVAL``) and
  after each (re)connection of the listener: the safety net for an edge nobody heard.
- **the wakes yield.** From the moment an edge is heard until the repair run it asked for is over, the
  controller is *busy*; the wake loop (:func:`app.capacity.controllers.wake.wake_pool`, for an edge as for
  a sweep)
  awaits :meth:`RepairController.wait_for_repairs` before it claims each pending reservation. So a
  wake finishes at most the one reservation it is placing (one short transaction) and then waits: the
  repair is planned and committed with no wake competing for the event loop, the database connections
  or the freed atoms.
- **replicas.** Every replica hears the edge and runs the repair; each reservation is claimed
  ``FOR UPDATE SKIP LOCKED`` (:func:`app.capacity.controllers.repair.repair_reservation`), so a reservation is
  repaired once and the other replica skips it. A broken reservation skipped because another
  transaction held its row is looked at again after ``REPAIR_RETRY`` seconds until it is repaired
  (gangs, which are not repaired yet, excepted).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.capacity.config import CapacityConfig
from app.capacity.controllers.listener import ListeningController
from app.capacity.controllers.repair import Repair, broken_reservations, repair_broken
from app.capacity.edges import REPAIR_CHANNEL
from app.capacity.planning.snapshot import PoolCache
from app.db.tables import reservations

log = logging.getLogger("better_compute.repair")

BOOKING_REPAIR = "booking-repair"
REPAIR_LISTENER = "repair-listener"
REPAIR_RETRY = 0.2  # seconds: a broken reservation another transaction held is looked at again this soon


async def unsettled(conn: AsyncConnection) -> list[str]:
    """Placed, non-gang reservations that still book an unhealthy or unbookable atom for the rest of
    their window (at most ``REPAIR_BATCH``, oldest first): what a repair run left to a retry."""
    broken = await broken_reservations(conn)
    if not broken:
        return []
    gang = reservations.c.spec["gang"]
    # SELECT id FROM reservations WHERE id = ANY(:broken)
    #    AND coalesce(jsonb_typeof(spec -> 'gang'), 'null') = 'null' ORDER BY id
    stmt = (
        sa.select(reservations.c.id)
        .where(
            reservations.c.id.in_(broken),
            sa.func.coalesce(sa.func.jsonb_typeof(gang), "null") == "null",
        )
        .order_by(reservations.c.id)
    )
    return list((await conn.execute(stmt)).scalars())


class RepairController(ListeningController[str]):
    """BookingRepair of one service process, on its own task: :meth:`listen` (LISTEN on ``bc_repair``)
    and :meth:`run` (repair every placed reservation booked on an unavailable atom). ``poke`` (set once
    the lifecycle exists) starts a run now. The wake loop awaits :meth:`wait_for_repairs` before each
    pending reservation it claims, so it never competes with a repair that was asked for."""

    def __init__(
        self,
        cache: PoolCache,
        config: CapacityConfig,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(cache, config, interval, clock)  # every run repairs everything: no sweep clock
        self._idle = asyncio.Event()
        self._idle.set()
        self._asked = False  # an edge arrived since the current run started

    def channels(self) -> Mapping[str, Callable[[str], None]]:
        return {REPAIR_CHANNEL: self.heard}

    def heard(self, pool_id: str) -> None:
        """A repair edge of ``pool_id`` arrived: the wakes yield from now until a repair run that started
        after this edge is over, and that run starts now."""
        self._heard.add(pool_id)
        self._asked = True
        self._idle.clear()
        self.poke()

    @property
    def busy(self) -> bool:
        """A repair was asked for and is not done yet (the wakes wait)."""
        return not self._idle.is_set()

    async def wait_for_repairs(self) -> None:
        """Return at once when no repair is asked for or running, else when it is over (the wake loop
        awaits this before each pending reservation it claims)."""
        await self._idle.wait()

    async def run(self, engine: AsyncEngine) -> list[Repair]:
        """One repair run: every placed reservation with a live booking on an unhealthy or unbookable
        atom (:func:`app.capacity.controllers.repair.repair_broken`, one transaction each, ``SKIP
        LOCKED``); those a
        concurrent transaction held are tried again ``REPAIR_RETRY`` seconds later. Returns the repairs
        committed here."""
        self._asked = False
        self._heard = set()
        self._idle.clear()  # a periodic run has priority too: it is one indexed query when nothing broke
        try:
            done = await repair_broken(engine, self.cache, self.config)
            async with engine.connect() as conn:
                left = await unsettled(conn)
        finally:
            if not self._asked:  # else an edge arrived during the run: the lifecycle runs us again at once
                self._idle.set()
        if left:
            log.debug(
                "booking repair: %d reservation(s) held elsewhere, again in %.1f s", len(left), REPAIR_RETRY
            )
            asyncio.get_running_loop().call_later(REPAIR_RETRY, self.poke)
        return done
