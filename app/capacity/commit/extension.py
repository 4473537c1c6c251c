"""The guarded extension of a placed allocation from ``old_end`` to ``new_end`` on the same atoms and
the same scalar amounts of the same node (``POST /v1/reservations/{id}/extend``; docs/lifecycle.md,
"Extend"). The entry point that takes the reservation row and the locks is
:mod:`app.capacity.reservations.extend`; this module holds the statements, each checked against what
others hold over the extension window ``[old_end, new_end)`` only (the allocation's own rows end at
``old_end``, so, windows being half-open, they never count against their own extension):

1. the lock statement of the guarded commit (:func:`app.capacity.commit.single.lock_statement`: the node
   still schedulable for the tenant ``FOR SHARE``, its atoms healthy and bookable ``FOR SHARE``, its
   ``node_resources`` rows ``FOR UPDATE``), through :func:`lock_allocation`, with the same lost-race
   checks (:mod:`app.capacity.commit.lost_races`);
2. the bookings: :func:`extend_bookings` lengthens them with one ``UPDATE``, and the exclusion
   constraint ``ex_device_bookings_overlap`` is the guard: a booking of another allocation over the
   extension window makes it fail (23P01; a deadlock 40P01 is raised for the caller's retry), answered
   as "not extended" after a rollback to its savepoint. :func:`atom_blocker` names that booking (read
   before the update, so the usual conflict needs no failed statement, and again after a failure);
3. the scalar holdings: :data:`EXTEND_HOLDINGS`, ``UPDATE ... WHERE <peak over [old_end, new_end)> +
   amount <= floor(allocatable * ratio) RETURNING resource`` (:func:`app.db.windows.room_for`), run after
   the ``node_resources`` lock, so its snapshot sees every holding committed before; a resource missing
   = it would run out; :func:`scalar_blocker` names a reservation holding it at the peak;
4. :func:`extend_allocations`: the allocations' ``during`` end at ``new_end``.

Lock order (docs/architecture.md): the caller holds the reservation row and the pool ``FOR SHARE``;
allocations are extended in node id order (nodes -> devices -> node_resources each), the quota charge
(:func:`app.quota.charges.extend_charge`) comes last.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.commit.lost_races import (
    LOST_RACE_SQLSTATES,
    LostRace,
    atoms_lost,
    node_lost,
    scalars_lost,
)
from app.capacity.commit.single import run_lock_statement
from app.db.tables import TS, allocations, device_bookings, node_resources, reservations, scalar_holdings
from app.db.tx import DEADLOCK, sqlstate
from app.db.windows import peak_instant, room_for
from app.placement.model import Candidate, PlacementRequest

_ALLOC = sa.bindparam("allocation", type_=sa.Text)
_OLD = sa.bindparam("old_end_at", type_=TS)
_NEW = sa.bindparam("new_end_at", type_=TS)


@dataclass(frozen=True, slots=True)
class Blocker:
    """What stands in the extension window: the reservation (id and tenant) that holds ``what`` (an atom
    id or a scalar resource) on the node from ``at`` (its booking's start, or the scalar's peak instant);
    ``held``/``cap``: for a scalar, what is held there and the node's capacity of it."""

    reservation_id: str
    tenant_id: str
    what: str
    at: datetime
    held: Decimal | None = None
    cap: Decimal | None = None


async def lock_allocation(
    conn: AsyncConnection, request: PlacementRequest, candidate: Candidate
) -> LostRace | None:
    """Lock what the guarded commit locks for ``candidate`` (the allocation as a candidate: its node,
    atoms and scalar amounts) and check it the same way: the node still schedulable for the tenant,
    every atom healthy and bookable, every scalar row there; a :class:`LostRace` naming the node
    otherwise (app/capacity/commit/single.py, guards 1-3)."""
    locked = await run_lock_statement(conn, request, candidate, None)
    return (
        node_lost(locked, request, candidate)
        or atoms_lost(locked, candidate)
        or scalars_lost(locked, candidate)
    )


_MINE = device_bookings.alias("mine")
_OTHER = device_bookings.alias("other")
# SELECT other.device_id, lower(other.during) AS at, a.reservation_id, r.tenant_id
#   FROM device_bookings mine
#   JOIN device_bookings other
#     ON other.device_pk = mine.device_pk AND other.allocation_id <> mine.allocation_id
#   JOIN allocations a ON a.id = other.allocation_id JOIN reservations r ON r.id = a.reservation_id
#  WHERE mine.allocation_id = :allocation AND other.during && tstzrange(:old_end_at, :new_end_at, '[)')
#  ORDER BY lower(other.during), other.device_id LIMIT 1
ATOM_BLOCKER = (
    sa.select(
        _OTHER.c.device_id,
        sa.func.lower(_OTHER.c.during).label("at"),
        allocations.c.reservation_id,
        reservations.c.tenant_id,
    )
    .select_from(
        _MINE.join(
            _OTHER,
            sa.and_(_OTHER.c.device_pk == _MINE.c.device_pk, _OTHER.c.allocation_id != _MINE.c.allocation_id),
        )
        .join(allocations, allocations.c.id == _OTHER.c.allocation_id)
        .join(reservations, reservations.c.id == allocations.c.reservation_id)
    )
    .where(
        _MINE.c.allocation_id == _ALLOC,
        _OTHER.c.during.op("&&")(sa.func.tstzrange(_OLD, _NEW, "[)")),
    )
    .order_by(sa.func.lower(_OTHER.c.during), _OTHER.c.device_id)
    .limit(1)
)


async def atom_blocker(
    conn: AsyncConnection, allocation_id: str, old_end: datetime, new_end: datetime
) -> Blocker | None:
    """The first booking of another allocation on one of the allocation's atoms that overlaps
    ``[old_end, new_end)`` (:data:`ATOM_BLOCKER`), or None."""
    params = {"allocation": allocation_id, "old_end_at": old_end, "new_end_at": new_end}
    row = (await conn.execute(ATOM_BLOCKER, params)).first()
    if row is None:
        return None
    return Blocker(row.reservation_id, row.tenant_id, row.device_id, row.at)


# UPDATE device_bookings SET during = tstzrange(lower(during), :new_end_at, '[)')
#  WHERE allocation_id = :allocation AND upper(during) = :old_end_at RETURNING device_id
#                  -- the exclusion constraint refuses it (23P01) when another booking overlaps
EXTEND_BOOKINGS = (
    sa.update(device_bookings)
    .where(device_bookings.c.allocation_id == _ALLOC, sa.func.upper(device_bookings.c.during) == _OLD)
    .values(during=sa.func.tstzrange(sa.func.lower(device_bookings.c.during), _NEW, "[)"))
    .returning(device_bookings.c.device_id)
)


async def extend_bookings(
    conn: AsyncConnection, allocation_id: str, old_end: datetime, new_end: datetime
) -> bool:
    """Lengthen the allocation's bookings that end at ``old_end`` to ``new_end`` inside ``SAVEPOINT
    capacity_extend``: False when the exclusion constraint refused it (another booking overlaps the
    extension window; rolled back to the savepoint). A deadlock (40P01) is raised: the caller's
    transaction is then the victim, and run again whole (:func:`app.db.tx.run_again_on_deadlock`)."""
    await conn.exec_driver_sql("SAVEPOINT capacity_extend")
    params = {"allocation": allocation_id, "old_end_at": old_end, "new_end_at": new_end}
    try:
        await conn.execute(EXTEND_BOOKINGS, params)
    except DBAPIError as exc:
        if sqlstate(exc) not in LOST_RACE_SQLSTATES or sqlstate(exc) == DEADLOCK:
            raise
        await conn.exec_driver_sql("ROLLBACK TO SAVEPOINT capacity_extend")
        return False
    return True


_HELD = scalar_holdings.alias("mine")
_NR = node_resources.alias("nr")
_CAP = sa.func.floor(_NR.c.allocatable * _NR.c.ratio)
# WITH fits AS (SELECT mine.resource FROM scalar_holdings mine
#                 JOIN node_resources nr ON nr.node_id = mine.node_id AND nr.resource = mine.resource
#                WHERE mine.allocation_id = :allocation AND mine.ends_at = :old_end_at
#                  AND (<peak of the node's mine.resource holdings over [:old_end_at, :new_end_at),
#                       app/db/windows.py>) + mine.amount <= floor(nr.allocatable * nr.ratio))
# UPDATE scalar_holdings SET ends_at = :new_end_at
#  WHERE allocation_id = :allocation AND ends_at = :old_end_at AND resource IN (SELECT resource FROM fits)
# RETURNING resource                                        -- one missing: it would run out
_FITS = (
    sa.select(_HELD.c.resource)
    .select_from(
        _HELD.join(_NR, sa.and_(_NR.c.node_id == _HELD.c.node_id, _NR.c.resource == _HELD.c.resource))
    )
    .where(
        _HELD.c.allocation_id == _ALLOC,
        _HELD.c.ends_at == _OLD,
        room_for(
            scalar_holdings,
            [scalar_holdings.c.node_id == _HELD.c.node_id, scalar_holdings.c.resource == _HELD.c.resource],
            _OLD,
            _NEW,
            _HELD.c.amount,
            _CAP,
            (_HELD, _NR),
        ),
    )
    .cte("fits")
)
EXTEND_HOLDINGS = (
    sa.update(scalar_holdings)
    .where(
        scalar_holdings.c.allocation_id == _ALLOC,
        scalar_holdings.c.ends_at == _OLD,
        scalar_holdings.c.resource.in_(sa.select(_FITS.c.resource)),
    )
    .values(ends_at=_NEW)
    .returning(scalar_holdings.c.resource)
)


async def holdings_of(conn: AsyncConnection, allocation_id: str, old_end: datetime) -> dict[str, Decimal]:
    """The allocation's scalar holdings that end at ``old_end``: resource -> amount."""
    rows = await conn.execute(
        sa.select(scalar_holdings.c.resource, scalar_holdings.c.amount).where(
            scalar_holdings.c.allocation_id == allocation_id, scalar_holdings.c.ends_at == old_end
        )
    )
    return {r.resource: Decimal(r.amount) for r in rows}


async def extend_holdings(
    conn: AsyncConnection, allocation_id: str, old_end: datetime, new_end: datetime
) -> set[str]:
    """Run :data:`EXTEND_HOLDINGS`: the resources whose holdings now end at ``new_end`` (the others
    would run out somewhere in ``[old_end, new_end)`` and are left as they were). The caller holds the
    node's ``node_resources`` rows (:func:`lock_allocation`)."""
    params = {"allocation": allocation_id, "old_end_at": old_end, "new_end_at": new_end}
    return set((await conn.execute(EXTEND_HOLDINGS, params)).scalars())


async def scalar_blocker(
    conn: AsyncConnection, node_id: str, resource: str, old_end: datetime, new_end: datetime
) -> Blocker | None:
    """Who holds ``resource`` on the node at the first instant of ``[old_end, new_end)`` where its peak
    is held (:func:`app.db.windows.peak_instant`): the holding there that started last (the newest
    arrival), with what is held there and the node's capacity; None when nothing is held."""
    where = [scalar_holdings.c.node_id == node_id, scalar_holdings.c.resource == resource]
    at, held = await peak_instant(conn, scalar_holdings, where, old_end, new_end)
    row = (
        await conn.execute(
            sa.select(allocations.c.reservation_id, reservations.c.tenant_id)
            .select_from(
                scalar_holdings.join(allocations, allocations.c.id == scalar_holdings.c.allocation_id).join(
                    reservations, reservations.c.id == allocations.c.reservation_id
                )
            )
            .where(*where, scalar_holdings.c.starts_at <= at, scalar_holdings.c.ends_at > at)
            .order_by(scalar_holdings.c.starts_at.desc(), scalar_holdings.c.allocation_id)
            .limit(1)
        )
    ).first()
    if row is None:
        return None
    cap = (
        await conn.execute(
            sa.select(sa.func.floor(node_resources.c.allocatable * node_resources.c.ratio)).where(
                node_resources.c.node_id == node_id, node_resources.c.resource == resource
            )
        )
    ).scalar()
    return Blocker(row.reservation_id, row.tenant_id, resource, at, Decimal(held), cap)


async def extend_allocations(conn: AsyncConnection, ids: list[str], new_end: datetime) -> None:
    """``UPDATE allocations SET during = tstzrange(lower(during), :new_end, '[)') WHERE id = ANY(:ids)``:
    the allocations end at ``new_end``."""
    await conn.execute(
        sa.update(allocations)
        .where(allocations.c.id.in_(ids))
        .values(during=sa.func.tstzrange(sa.func.lower(allocations.c.during), new_end, "[)"))
    )


def as_candidate(allocation: Any, node_name: str, booked: list[str]) -> Candidate:
    """A live ``allocations`` row as the :class:`Candidate` the lock statement takes: its atoms, its
    scalar amounts and, for a whole-node lease, the other atoms it books (``booked``: the device ids of
    its bookings)."""
    atoms = tuple(allocation.atoms)
    resources = {k: Decimal(v) for k, v in (allocation.resources or {}).items()}
    held = tuple(sorted(set(booked) - set(atoms)))
    return Candidate(allocation.node_id, node_name, (atoms,), resources, 0.0, {}, held)
