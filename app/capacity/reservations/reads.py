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
from app.db.tables import allocations, reservations
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


@dataclass(frozen=True, slots=True)
class ListFilter:
    """What a page of reservations is narrowed to, all of it together (AND); ``None``: no narrowing.
    ``node_id``: reservations with an allocation on the node, now or before (a planned window too)."""

    tenant_id: str | None = None
    status: str | None = None
    pool_id: str | None = None
    node_id: str | None = None


@reads
async def list_reservations(
    conn: AsyncConnection,
    where: ListFilter,
    limit: int = 100,
    after: tuple[datetime, str] | None = None,
) -> ReservationPage:
    """A page of reservations newest first (``created_at`` then id, descending), narrowed by ``where``,
    after the key ``(createdAt, id)`` of the previous page's last item (two statements: the rows, then
    their allocations). A pool or node that does not exist narrows to nothing: an empty page, as an
    unknown tenant (docs/api.md, "Reservations and preview")."""
    # SELECT * FROM reservations r WHERE [r.tenant_id = :t] [AND r.status = :s] [AND r.pool_id = :p]
    #   [AND EXISTS (SELECT 1 FROM allocations a WHERE a.reservation_id = r.id AND a.node_id = :n)]
    #   [AND (r.created_at, r.id) < (:c, :id)] ORDER BY r.created_at DESC, r.id DESC LIMIT :limit + 1
    stmt = (
        sa.select(reservations)
        .order_by(reservations.c.created_at.desc(), reservations.c.id.desc())
        .limit(limit + 1)
    )
    if where.tenant_id is not None:
        stmt = stmt.where(reservations.c.tenant_id == where.tenant_id)
    if where.status is not None:
        stmt = stmt.where(reservations.c.status == where.status)
    if where.pool_id is not None:
        stmt = stmt.where(reservations.c.pool_id == where.pool_id)
    if where.node_id is not None:
        on_node = sa.select(allocations.c.id).where(
            allocations.c.reservation_id == reservations.c.id, allocations.c.node_id == where.node_id
        )
        stmt = stmt.where(on_node.exists())
    if after is not None:
        stmt = stmt.where(sa.tuple_(reservations.c.created_at, reservations.c.id) < sa.tuple_(*after))
    rows = (await conn.execute(stmt)).all()
    page, more = rows[:limit], len(rows) > limit
    allocs = await read_allocations(conn, [r.id for r in page])
    items = [row_view(r, allocs.get(r.id, [])) for r in page]
    return ReservationPage(items, (items[-1].createdAt, items[-1].id) if more else None)
