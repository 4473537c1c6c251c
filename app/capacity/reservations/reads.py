"""Read reservations: one by id (:func:`get_reservation`) and a page of them (:func:`list_reservations`),
as ``Reservation`` answers (docs/api.md, "HTTP API"). Plain reads, no locks; another tenant's
reservation is not found, never forbidden (:mod:`app.capacity.reservations.access`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.answers.reservations import Reservation
from app.capacity.reservations.access import reservation_not_found
from app.capacity.views import read_allocations, read_view, row_view
from app.db.tables import reservations
from app.db.tx import reads
from app.iam.authorize import exists_for


@dataclass(frozen=True, slots=True)
class ReservationPage:
    """A page of reservations, newest first, and ``next``: the last item's ``(createdAt, id)`` when more
    remain (the key the next page starts after), else None."""

    items: list[Reservation]
    next: tuple[str, str] | None


@reads
async def get_reservation(conn: AsyncConnection, reservation_id: str, tenant_id: str | None) -> Reservation:
    """The reservation view (one statement, :func:`~app.capacity.views.read_view`); another tenant's
    reservation (``tenant_id`` set) is NotFound, not 403."""
    view = await read_view(conn, reservation_id)
    if view is None or not exists_for(tenant_id, view.tenantId):
        raise reservation_not_found(reservation_id)
    return view


@reads
async def list_reservations(
    conn: AsyncConnection,
    tenant_id: str | None,
    status: str | None,
    limit: int = 100,
    after: tuple[datetime, str] | None = None,
) -> ReservationPage:
    """A page of reservations newest first (``created_at`` then id, descending), filtered by tenant and
    status, after the key ``(createdAt, id)`` of the previous page's last item (two statements: the
    rows, then their allocations)."""
    # SELECT * FROM reservations WHERE [tenant_id = :t] [AND status = :s] [AND (created_at, id) < (:c, :id)]
    #   ORDER BY created_at DESC, id DESC LIMIT :limit + 1
    stmt = (
        sa.select(reservations)
        .order_by(reservations.c.created_at.desc(), reservations.c.id.desc())
        .limit(limit + 1)
    )
    if tenant_id is not None:
        stmt = stmt.where(reservations.c.tenant_id == tenant_id)
    if status is not None:
        stmt = stmt.where(reservations.c.status == status)
    if after is not None:
        stmt = stmt.where(sa.tuple_(reservations.c.created_at, reservations.c.id) < sa.tuple_(*after))
    rows = (await conn.execute(stmt)).all()
    page, more = rows[:limit], len(rows) > limit
    allocs = await read_allocations(conn, [r.id for r in page])
    items = [row_view(r, allocs.get(r.id, [])) for r in page]
    return ReservationPage(items, (items[-1].createdAt, items[-1].id) if more else None)
