"""The answers of reservations: the :class:`~app.answers.reservations.Reservation` and
:class:`~app.answers.reservations.Allocation` models the API shows, built from stored rows
(:func:`row_view`, :func:`reservation_view`, :func:`read_view`, one prepared statement) or from what a
create or batch just wrote (:func:`placed_view`, :func:`committed_view`). A view sets exactly the fields
its answer shows (routes serialise with ``exclude_unset``: a create's ``warnings`` only when intake had
any, :func:`with_warnings`). No visibility checks here. docs/lifecycle.md.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from decimal import Decimal
from types import SimpleNamespace
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.answers.reservations import Allocation, Condition, Preview, Reservation, ReservationSpec
from app.answers.statuses import ReservationStatus
from app.capacity.commit.shapes import Committed
from app.capacity.conditions import from_stored
from app.capacity.placing.batch import BatchEntry
from app.capacity.placing.inline import Placed
from app.capacity.queue.intake import Decision
from app.db.prepared import Prepared
from app.db.tables import allocations, reservations
from app.jsonnum import num
from app.placement.model import PlacementRequest
from app.placement.request import ReservationRequest


def spec_view(spec: dict[str, Any]) -> ReservationSpec:
    """The answer's ``spec`` from a stored spec: ``deadline`` is shown ``null`` when the spec has none
    (none was given: the spec leaves it out, so specs stored before deadlines hash alike)."""
    return ReservationSpec.model_validate({"deadline": None, **spec})


def placed_view(
    body: ReservationRequest,
    reservation_id: str,
    spec: dict[str, Any],
    created_at: datetime,
    allocs: list[Allocation],
    conditions: list[Condition] | None = None,
) -> Reservation:
    """The view of a reservation just placed, from what the create wrote (what :func:`row_view` would read
    back: the commit marked the row ``placed``, with no conditions or, after a preemption, the
    preemptor's ``Preempted`` condition). ``spec``: the stored spec (``body.spec()``)."""
    written = SimpleNamespace(
        id=reservation_id,
        tenant_id=body.tenantId,
        pool_id=body.poolId,
        idempotency_key=body.idempotencyKey,
        spec=spec,
        planned_start=None,
        created_at=created_at,
        released_at=None,
    )  # the reservations row as the commit left it
    return _reservation(written, allocs, ReservationStatus.placed, conditions or [])


def committed_view(a: Committed, request: PlacementRequest) -> Allocation:
    """The view of an allocation just written (what :func:`read_allocations` would read back); scalar
    amounts whole as integers (:func:`app.jsonnum.num`)."""
    assert request.start is not None and request.end is not None
    return Allocation(
        id=a.allocation_id,
        nodeId=a.node_id,
        atoms=list(a.atoms),
        resources={k: num(Decimal(v)) for k, v in a.resources.items()},
        start=request.start.isoformat(),
        end=request.end.isoformat(),
        releasedAt=None,
    )


def allocation_view(
    allocation_id: str, node_id: str, atoms: Any, resources: Any, during: Any, released_at: Any
) -> Allocation:
    """An allocation as the API shows it, from its stored columns (``during``: the ``tstzrange``)."""
    return Allocation(
        id=allocation_id,
        nodeId=node_id,
        atoms=list(atoms),
        resources={k: num(Decimal(v)) for k, v in (resources or {}).items()},
        start=during.lower.isoformat(),
        end=during.upper.isoformat(),
        releasedAt=released_at.isoformat() if released_at else None,
    )


async def read_allocations(conn: AsyncConnection, reservation_ids: list[str]) -> dict[str, list[Allocation]]:
    """Allocation views by reservation id for ``reservation_ids``, in creation order (one statement)."""
    out: dict[str, list[Allocation]] = defaultdict(list)
    if not reservation_ids:
        return out
    rows = (
        await conn.execute(
            sa.select(allocations)
            .where(allocations.c.reservation_id.in_(reservation_ids), allocations.c.planned.is_(False))
            .order_by(allocations.c.created_at, allocations.c.id)
        )
    ).all()
    for a in rows:
        out[a.reservation_id].append(
            allocation_view(a.id, a.node_id, a.atoms, a.resources, a.during, a.released_at)
        )
    return out


# the allocation columns of :func:`read_view`, labelled apart from the reservation's
_ALLOCATION_COLUMNS = (
    allocations.c.id.label("a_id"),
    allocations.c.node_id.label("a_node_id"),
    allocations.c.atoms.label("a_atoms"),
    allocations.c.resources.label("a_resources"),
    allocations.c.during.label("a_during"),
    allocations.c.released_at.label("a_released_at"),
)


# SELECT r.*, a.id, a.node_id, a.atoms, a.resources, a.during, a.released_at
#   FROM reservations r LEFT JOIN allocations a ON a.reservation_id = r.id AND NOT a.planned
#  WHERE r.id = :reservation_id ORDER BY a.created_at, a.id
READ_VIEW = Prepared(
    sa.select(reservations, *_ALLOCATION_COLUMNS)
    .select_from(
        reservations.outerjoin(
            allocations,
            sa.and_(allocations.c.reservation_id == reservations.c.id, allocations.c.planned.is_(False)),
        )
    )
    .where(reservations.c.id == sa.bindparam("reservation_id", type_=sa.Text))
    .order_by(allocations.c.created_at, allocations.c.id)
)


async def read_view(conn: AsyncConnection, reservation_id: str) -> Reservation | None:
    """The view of a reservation (``Reservation``: the row and its allocations, a planned window's left
    out: ``plannedStart`` and the ``Planned`` condition show it) in one statement
    (:data:`READ_VIEW`, prepared), None when there is none. No visibility check: callers authorize on
    its ``tenantId``."""
    rows = (await READ_VIEW.run(conn, {"reservation_id": reservation_id})).all()
    if not rows:
        return None
    allocs = [
        allocation_view(r.a_id, r.a_node_id, r.a_atoms, r.a_resources, r.a_during, r.a_released_at)
        for r in rows
        if r.a_id is not None
    ]
    return row_view(rows[0], allocs)


def row_view(row: Any, allocs: list[Allocation]) -> Reservation:
    """A ``Reservation`` view from a ``reservations`` row and its allocation views (the stored spec and
    conditions read as models)."""
    return _reservation(row, allocs, row.status, from_stored(row.conditions))


def _reservation(row: Any, allocs: list[Allocation], status: str, conditions: list[Condition]) -> Reservation:
    """A ``Reservation`` of ``row`` with this status and these conditions."""
    return Reservation(
        id=row.id,
        tenantId=row.tenant_id,
        poolId=row.pool_id,
        status=status,
        idempotencyKey=row.idempotency_key,
        spec=spec_view(row.spec),
        allocations=allocs,
        conditions=conditions,
        plannedStart=row.planned_start.isoformat() if row.planned_start else None,
        createdAt=row.created_at.isoformat(),
        releasedAt=row.released_at.isoformat() if row.released_at else None,
    )


async def reservation_view(conn: AsyncConnection, row: Any) -> Reservation:
    """A ``Reservation`` view from a ``reservations`` row, its allocations read (one statement)."""
    allocs = await read_allocations(conn, [row.id])
    return row_view(row, allocs.get(row.id, []))


def decided_view(row: Any, decision: Decision, entry: BatchEntry | None) -> Reservation:
    """The view of a reservation a batch decided (what :func:`read_view` reads back after COMMIT): the
    claimed row with the decision's status and conditions and, when placed, the allocations the batch
    wrote."""
    allocs: list[Allocation] = []
    if decision.status == "placed" and entry is not None and isinstance(entry.outcome, Placed):
        allocs = [committed_view(a, entry.request) for a in entry.outcome.allocations]
    return _reservation(row, allocs, decision.status, decision.conditions)


Warned = TypeVar("Warned", Reservation, Preview)


def with_warnings(answer: Warned, warnings: tuple[str, ...]) -> Warned:
    """``answer`` with ``warnings`` set when intake had any (selector keys no device or node of the pool
    carries; a create's or a preview's answer only, never stored), else ``answer`` as it is (no
    ``warnings`` field shown)."""
    return answer.model_copy(update={"warnings": list(warnings)}) if warnings else answer
