"""Quota refunds: what a reservation stops holding when it is released, preempted, sent back to
``pending`` or not placed after all (docs/quota.md, "Usage is counted per instant").

A refund only shrinks what is held, so it takes no ``quota_usage`` lock (docs/lifecycle.md, "Lock
order"); a reservation whose window is over stops counting by itself and is refunded nothing. What a
charge holds is written by app/quota/charges.py.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.prepared import Prepared
from app.db.tables import quota_holdings
from app.db.windows import cut

# DELETE FROM quota_holdings WHERE reservation_id = :reservation_id
REFUND = Prepared(
    sa.delete(quota_holdings).where(
        quota_holdings.c.reservation_id == sa.bindparam("reservation_id", type_=sa.Text)
    )
)


async def refund(conn: AsyncConnection, reservation_id: str) -> None:
    """Drop everything the reservation holds (it was charged and then could not be placed):
    :data:`REFUND`, prepared."""
    await REFUND.run(conn, {"reservation_id": reservation_id})


async def cut_holdings(conn: AsyncConnection, reservation_id: str, at: datetime) -> None:
    """A release at ``at``: the reservation's holdings end there (removed if they had not started)."""
    await cut(conn, quota_holdings, [quota_holdings.c.reservation_id == reservation_id], at)


async def drop_holdings(conn: AsyncConnection, reservation_id: str) -> None:
    """A reservation that goes back to ``pending`` (BookingRepair found no room) holds nothing, and is
    charged again for its new window when it is woken: its quota holdings are removed, not cut, since
    one row per reservation and resource holds its window (a cut row would collide with the new charge).
    The time it was placed stays on its allocations."""
    await refund(conn, reservation_id)  # DELETE FROM quota_holdings WHERE reservation_id = :id
