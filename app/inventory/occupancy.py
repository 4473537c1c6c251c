"""A pool's occupancy over a window (``GET /v1/pools/{poolId}/occupancy``; docs/api.md, "Occupancy"):
each node's conditions, its atoms with the bookings overlapping ``[from, to)`` and its scalar resources
with what they hold over the window as a step function. Reads only, no locks, six set-based statements
whatever the pool's size (the pool and the database's ``now``, its nodes, their atoms, the bookings, the
scalar rows, the holdings); no statement per node.

Who booked an atom is shown only to a caller that may read that tenant's reservations (the rule of
``GET /v1/reservations``, :func:`app.iam.authorize.may_read_work_of`): to others the booking is there,
with ``reservationId`` and ``tenantId`` null.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from pydantic_core import to_json
from sqlalchemy.dialects.postgresql import TSTZRANGE
from sqlalchemy.ext.asyncio import AsyncConnection

from app.answers.occupancy import PoolOccupancy
from app.db.locks import pool_not_found
from app.db.tables import (
    allocations,
    device_bookings,
    devices,
    node_resources,
    nodes,
    pools,
    reservations,
    scalar_holdings,
)
from app.db.tx import Db, reads
from app.db.windows import holdings_over
from app.errors import InvalidInput
from app.jsonnum import num
from app.placement.scalar_capacity import scalar_capacity

DEFAULT_SPAN = timedelta(hours=48)
MAX_SPAN = timedelta(days=31)


@dataclass(frozen=True, slots=True)
class Window:
    """The asked window; ``None``: the default (``from`` = the database's now, ``to`` = from + 48 h)."""

    start: datetime | None = None
    end: datetime | None = None


def resolve_window(now: datetime, asked: Window) -> tuple[datetime, datetime]:
    """``(from, to)`` in UTC: the defaults filled in from ``now``; InvalidInput (422) at ``to`` when it is
    not after ``from`` or the span is over 31 days, at ``from`` when its default ``to`` would leave year
    9999."""
    start = (asked.start or now).astimezone(UTC)
    if asked.end is None:
        try:
            end = start + DEFAULT_SPAN
        except OverflowError:
            raise InvalidInput("from: from + 48 h (the default to) is after year 9999", path="from") from None
    else:
        end = asked.end.astimezone(UTC)
    if end <= start:
        raise InvalidInput(f"to: must be after from ({start.isoformat()})", path="to")
    if end - start > MAX_SPAN:
        raise InvalidInput(f"to: the window spans at most 31 days from {start.isoformat()}", path="to")
    return start, end


def held_steps(
    holdings: Iterable[tuple[Decimal, datetime, datetime]], start: datetime, end: datetime
) -> list[tuple[datetime, datetime, Decimal]]:
    """What ``holdings`` (``(amount, starts_at, ends_at)``, half-open) hold over ``[start, end)`` as a
    step function: ``(from, to, held)`` in time order, each the longest run of one amount (neighbours of
    equal amount merged), runs holding nothing left out. ``cpu 4 [t0, t2)`` and ``8 [t1, t3)`` give
    ``[t0, t1) 4``, ``[t1, t2) 12``, ``[t2, t3) 8``."""
    deltas: dict[datetime, Decimal] = defaultdict(Decimal)
    for amount, s, e in holdings:
        s, e = max(s, start), min(e, end)
        if s < e:
            deltas[s] += amount
            deltas[e] -= amount
    steps: list[tuple[datetime, datetime, Decimal]] = []
    held = Decimal(0)
    instants = sorted(deltas)
    for at, following in zip(instants, instants[1:], strict=False):
        held += deltas[at]
        if held == 0:
            continue
        if steps and steps[-1][1] == at and steps[-1][2] == held:
            steps[-1] = (steps[-1][0], following, held)
        else:
            steps.append((at, following, held))
    return steps


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


class _Times(dict[datetime, str]):
    """ISO 8601 text of each instant, written once: bookings of one reservation share their window."""

    def __missing__(self, at: datetime) -> str:
        self[at] = text = at.isoformat()
        return text


async def _bookings(
    conn: AsyncConnection, pool_id: str, start: datetime, end: datetime, sees: Callable[[str], bool]
) -> dict[int, list[dict[str, Any]]]:
    """device pk -> its bookings overlapping the window, by start (:class:`OccupancyBooking` fields); by
    ``pk``, not id: a deleted node's device may carry the id of a live one, and keeps its own history::

    SELECT b.device_pk, lower(b.during), upper(b.during), r.id, r.tenant_id, (r.spec->>'spot')::boolean,
           r.status, a.planned
      FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id
      JOIN reservations r ON r.id = a.reservation_id
     WHERE b.pool_id = :pool AND b.during && tstzrange(:from, :to, '[)')
     ORDER BY b.device_pk, lower(b.during)
    """
    during = device_bookings.c.during
    asked = sa.func.tstzrange(start, end, "[)", type_=TSTZRANGE)
    rows = (
        await conn.execute(
            sa.select(
                device_bookings.c.device_pk,
                sa.func.lower(during).label("starts_at"),
                sa.func.upper(during).label("ends_at"),
                reservations.c.id,
                reservations.c.tenant_id,
                sa.func.coalesce(sa.cast(reservations.c.spec["spot"].astext, sa.Boolean), False).label(
                    "spot"
                ),
                reservations.c.status,
                allocations.c.planned,
            )
            .join(allocations, allocations.c.id == device_bookings.c.allocation_id)
            .join(reservations, reservations.c.id == allocations.c.reservation_id)
            .where(device_bookings.c.pool_id == pool_id, during.op("&&")(asked))
            .order_by(device_bookings.c.device_pk, sa.func.lower(during))
        )
    ).all()
    seen: dict[str, bool] = {}
    times = _Times()
    found: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for device_pk, starts_at, ends_at, reservation_id, tenant_id, spot, status, planned in rows:
        shown = seen.get(tenant_id)
        if shown is None:
            shown = seen[tenant_id] = sees(tenant_id)
        found[device_pk].append(
            {
                "start": times[starts_at],
                "end": times[ends_at],
                "reservationId": reservation_id if shown else None,
                "tenantId": tenant_id if shown else None,
                "spot": bool(spot),
                "status": status,
                "planned": planned,
            }
        )
    return found


async def _scalars(
    conn: AsyncConnection, pool_id: str, start: datetime, end: datetime
) -> dict[str, list[dict[str, Any]]]:
    """node id -> its scalar resources by name (:class:`OccupancyScalar` fields), with capacity and the
    steps held over the window::

    SELECT s.node_id, s.resource, s.allocatable, s.ratio FROM node_resources s
      JOIN nodes n ON n.id = s.node_id WHERE n.pool_id = :pool;
    SELECT node_id, resource, amount, starts_at, ends_at FROM scalar_holdings
     WHERE pool_id = :pool AND ends_at > :from AND starts_at < :to
    """
    holdings: dict[tuple[str, str], list[tuple[Decimal, datetime, datetime]]] = defaultdict(list)
    in_pool = scalar_holdings.c.pool_id == pool_id
    for h in (
        await conn.execute(
            holdings_over(scalar_holdings, start, end, in_pool, keys=[scalar_holdings.c.node_id])
        )
    ).all():
        holdings[(h.node_id, h.resource)].append((h.amount, h.starts_at, h.ends_at))
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    times = _Times()
    for s in (
        await conn.execute(
            sa.select(node_resources)
            .join(nodes, nodes.c.id == node_resources.c.node_id)
            .where(nodes.c.pool_id == pool_id, nodes.c.deleted_at.is_(None))
            .order_by(node_resources.c.node_id, node_resources.c.resource)
        )
    ).all():
        steps = held_steps(holdings.get((s.node_id, s.resource), ()), start, end)
        found[s.node_id].append(
            {
                "resource": s.resource,
                "capacity": num(scalar_capacity(s.allocatable, s.ratio)),
                "steps": [{"start": times[a], "end": times[b], "held": num(h)} for a, b, h in steps],
            }
        )
    return found


async def pool_occupancy(db: Db, pool_id: str, asked: Window, sees: Callable[[str], bool]) -> PoolOccupancy:
    """:func:`occupancy_document` as its model (the whole tree validated once by pydantic-core)."""
    return PoolOccupancy.model_validate(await occupancy_document(db, pool_id, asked, sees))


async def occupancy_json(db: Db, pool_id: str, asked: Window, sees: Callable[[str], bool]) -> bytes:
    """:func:`occupancy_document` as the JSON text :class:`PoolOccupancy` renders (``model_dump_json(
    by_alias=True)``, byte for byte: the document already has the model's keys, order and value types),
    without validating the tree again: a 1,000-node pool has tens of thousands of bookings and steps, and
    the validation took a quarter of the answer's time (bench/ui_pool_page.py)."""
    return to_json(await occupancy_document(db, pool_id, asked, sees))


@reads
async def occupancy_document(
    conn: AsyncConnection, pool_id: str, asked: Window, sees: Callable[[str], bool]
) -> dict[str, Any]:
    """The occupancy of ``pool_id`` over ``asked`` (:func:`resolve_window`) as a :class:`PoolOccupancy`
    document (its JSON keys, plain values): nodes in id order (as
    ``GET /v1/pools/{id}/nodes``), atoms in device order (as ``GET /v1/nodes/{id}``), each atom's
    bookings overlapping the window by start (their own windows, planned windows of pending reservations
    included, ended and released history too), each scalar's steps (:func:`held_steps`: steps holding
    nothing left out). ``sees(tenant)``: whether the caller may see that tenant's reservation ids (else
    null). NotFound (404) for no pool, InvalidInput (422 at ``from`` / ``to``) for a bad window."""
    pool = (
        await conn.execute(
            sa.select(pools.c.id, pools.c.name, sa.func.now().label("now")).where(pools.c.id == pool_id)
        )
    ).first()
    if pool is None:
        raise pool_not_found(pool_id)
    start, end = resolve_window(pool.now, asked)
    node_rows = (
        await conn.execute(
            sa.select(
                nodes.c.id,
                nodes.c.name,
                nodes.c.no_schedule_reasons,
                nodes.c.ready,
                nodes.c.heartbeat_lost,
                nodes.c.last_heartbeat_at,
            )
            .where(nodes.c.pool_id == pool_id, nodes.c.deleted_at.is_(None))  # a deleted node is history
            .order_by(nodes.c.id)
        )
    ).all()
    atom_rows = (
        await conn.execute(
            sa.select(
                devices.c.node_id,
                devices.c.pk,
                devices.c.id,
                devices.c["class"].label("device_class"),
                devices.c.healthy,
                devices.c.bookable,
            )
            .join(nodes, nodes.c.id == devices.c.node_id)
            .where(nodes.c.pool_id == pool_id, nodes.c.deleted_at.is_(None))
            .order_by(devices.c.node_id, devices.c.ordinal, devices.c.id)
        )
    ).all()
    bookings = await _bookings(conn, pool_id, start, end, sees)
    scalars = await _scalars(conn, pool_id, start, end)
    atoms: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for d in atom_rows:
        atoms[d.node_id].append(
            {
                "atomId": d.id,
                "class": d.device_class,
                "healthy": d.healthy,
                "bookable": d.bookable,
                "bookings": bookings.get(d.pk, []),
            }
        )
    return {
        "poolId": pool.id,
        "poolName": pool.name,
        "from": start.isoformat(),
        "to": end.isoformat(),
        "now": pool.now.isoformat(),
        "nodes": [
            {
                "nodeId": n.id,
                "nodeName": n.name,
                "schedulable": not n.no_schedule_reasons,
                "reasons": list(n.no_schedule_reasons),
                "ready": n.ready,
                "heartbeatLost": n.heartbeat_lost,
                "lastHeartbeat": _iso(n.last_heartbeat_at),
                "atoms": atoms.get(n.id, []),
                "scalars": scalars.get(n.id, []),
            }
            for n in node_rows
        ],
    }
