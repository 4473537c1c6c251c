"""The earliest window of a request: one read of what the pool holds over the searched span, the pure
search for candidate starts (:mod:`app.placement.earliest`), then the placement pipeline at each candidate
in increasing order until one fits (docs/lifecycle.md, "Earliest start").

Reads, all plain (no locks; a create commits what it finds through the guarded commit, which decides):

- the pool head and its cached static inventory, and each node's state that is not a window (NoSchedule
  reasons, leasable, unhealthy or unbookable atoms), as it is now;
- the intervals overlapping ``[T0, last + d)``, where ``T0`` is the requested start, ``d`` the duration
  and ``last`` the database clock plus ``BC_CAPACITY_MAX_LEAD``: the bookings of atoms of the requested
  classes (of every atom for a lease), the scalar holdings of the requested resources (of every resource
  for a lease), and the tenant's quota holdings of the charged resources that have a limit, with the
  limits;
- per verified candidate, what :func:`~app.capacity.planning.plan.plan_request` reads.

Cost bound: those reads, the pure search (``O(m log m)`` per node for its ``m`` intervals), and at most
``BC_CAPACITY_EARLIEST_PLANS`` plans (default 16). Past that bound, or past ``last``, the answer is
:class:`NoWindow` with its reason. The intervals are read span by span (:func:`find_earliest`): one day
of starts first, then twice as long each time, so the reads follow how far the answer lies, not how far
the pool is booked ahead.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.config import CapacityConfig
from app.capacity.planning.plan import plan_request
from app.capacity.planning.snapshot import PoolCache, PoolHead, read_pool_head
from app.capacity.requests import quota_amounts
from app.db.tables import device_bookings, devices, nodes, quota_holdings, quota_limits, scalar_holdings
from app.db.windows import window
from app.placement.earliest import EarliestSearch, Held, NodeHoldings, QuotaRoom, search
from app.placement.filters.lease import NODE_BINDING
from app.placement.model import Candidate, NodeSnapshot, NodeState, PlacementRequest, Plan
from app.placement.summary import ARCHIVED_POOL


@dataclass(frozen=True, slots=True)
class EarliestWindow:
    """The first candidate start at which the pipeline found a plan: ``request`` is the request moved to
    that window (``request.start``, ``request.end``), ``plan`` the plan made there."""

    request: PlacementRequest
    plan: Plan

    @property
    def placements(self) -> tuple[Candidate, ...]:
        """The best candidate (a gang: its members, the first one first)."""
        return self.plan.members or (self.plan.ranked[0],)


@dataclass(frozen=True, slots=True)
class NoWindow:
    """No window within the lead: ``reason`` says why."""

    reason: str


def plans_spent_reason(plans: int) -> str:
    """``earliest: no fit at the first <n> candidate starts (BC_CAPACITY_EARLIEST_PLANS)``."""
    return f"earliest: no fit at the first {plans} candidate starts (BC_CAPACITY_EARLIEST_PLANS)"


FIRST_SPAN = timedelta(days=1)  # the first span of starts searched; each next one doubles it


async def find_earliest(
    conn: AsyncConnection,
    cache: PoolCache,
    config: CapacityConfig,
    request: PlacementRequest,
    now: datetime,
    *,
    head: PoolHead | None = None,
    first_failed: bool = False,
) -> EarliestWindow | NoWindow:
    """The earliest window at or after ``request.start`` at which the whole request fits, planned as a
    placement at that start would be (same pipeline, filters, shortlist and gang planner), within
    ``now + config.max_lead``; or :class:`NoWindow`. ``first_failed``: the caller planned
    ``request.start`` already and it did not fit, so that start is not planned again. Raises NotFound
    (pool).

    Starts are searched in spans from ``request.start``: one day (:data:`FIRST_SPAN`), then each span
    twice as long, up to the lead. The search of a span reads only the intervals overlapping it (plus the
    window's length), and its candidate starts are exactly the wider search's starts within it, so a
    request that fits soon reads only the near future, and one that fits late reads at most twice what
    the last span holds."""
    assert request.start is not None and request.end is not None
    head = head or await read_pool_head(conn, request.pool_id)
    if head.archived:
        return NoWindow(ARCHIVED_POOL)
    last = now + config.max_lead
    duration = request.end - request.start
    states = await _node_states(conn, head.id)
    plans = 0
    searched: datetime | None = None  # the starts up to here were candidates of an earlier span
    span = FIRST_SPAN
    while True:
        span_end = min(request.start + span, last)
        found = await read_search(conn, cache, head, request, span_end, states)
        for start in found.starts():
            if (searched is not None and start <= searched) or (first_failed and start == request.start):
                continue
            if plans >= config.earliest_plans:
                return NoWindow(plans_spent_reason(plans))
            plans += 1
            moved = replace(request, start=start, end=start + duration)
            outcome = await plan_request(conn, cache, moved, config.options, config.shortlist_min, head=head)
            if outcome.head.archived:
                return NoWindow(ARCHIVED_POOL)
            if isinstance(outcome.plan, Plan):
                return EarliestWindow(moved, outcome.plan)
        if span_end >= last:
            return NoWindow(found.why_none())
        searched, span = span_end, span * 2


async def read_search(
    conn: AsyncConnection,
    cache: PoolCache,
    head: PoolHead,
    request: PlacementRequest,
    last: datetime,
    states: dict[str, NodeState] | None = None,
) -> EarliestSearch:
    """The pure search for ``request`` with candidate starts up to ``last``, on this module's reads
    (``states``: the nodes' states when the caller read them already)."""
    assert request.start is not None and request.end is not None
    inventory = await cache.inventory(conn, head)
    lease = request.binding == NODE_BINDING
    span = window(request.start, last + (request.end - request.start))
    if states is None:
        states = await _node_states(conn, head.id)
    holdings = await _node_holdings(conn, head.id, request, span, lease)
    quota = await _quota_room(conn, request, span)
    snapshots = [
        NodeSnapshot(inventory.nodes[node_id], states.get(node_id, NodeState()))
        for node_id in inventory.order
        if node_id in states
    ]
    return search(request, snapshots, inventory.capacities, holdings, quota, last)


async def _node_states(conn: AsyncConnection, pool_id: str) -> dict[str, NodeState]:
    """Each node's state that is not a window, as it is now (the search assumes it at every start)::

    SELECT id, no_schedule_reasons, leasable FROM nodes WHERE pool_id = :pool
    SELECT d.node_id, d.id FROM devices d JOIN nodes n ON n.id = d.node_id
     WHERE n.pool_id = :pool AND NOT (d.healthy AND d.bookable)
    """
    unavailable: dict[str, set[str]] = defaultdict(set)
    for r in (
        await conn.execute(
            sa.select(devices.c.node_id, devices.c.id)
            .join(nodes, nodes.c.id == devices.c.node_id)
            .where(nodes.c.pool_id == pool_id, sa.not_(sa.and_(devices.c.healthy, devices.c.bookable)))
        )
    ).all():
        unavailable[r.node_id].add(r.id)
    rows = (
        await conn.execute(
            sa.select(nodes.c.id, nodes.c.no_schedule_reasons, nodes.c.leasable).where(
                nodes.c.pool_id == pool_id
            )
        )
    ).all()
    return {
        r.id: NodeState(tuple(r.no_schedule_reasons), r.leasable, frozenset(unavailable.get(r.id, ())))
        for r in rows
    }


def _raw_array(expr: Any) -> Any:
    """``array_agg(expr)`` decoded by asyncpg and passed through untouched (100,000 bookings)."""
    return sa.func.array_agg(expr, type_=sa.types.NullType())


async def _node_holdings(
    conn: AsyncConnection, pool_id: str, request: PlacementRequest, span: Any, lease: bool
) -> dict[str, NodeHoldings]:
    """node id -> its bookings (of the requested classes' atoms; every atom for a lease) and scalar
    holdings (of the requested resources; every resource for a lease) overlapping ``span``::

    SELECT d.node_id, array_agg(b.device_id ORDER BY b.device_id, b.during), array_agg(lower(b.during) ...),
           array_agg(upper(b.during) ...)
      FROM device_bookings b JOIN devices d ON d.pk = b.device_pk
     WHERE b.pool_id = :pool AND b.during && :span [AND d.class = ANY(:classes)]
     GROUP BY d.node_id
    SELECT node_id, resource, amount, starts_at, ends_at FROM scalar_holdings
     WHERE pool_id = :pool AND ends_at > lower(:span) AND starts_at < upper(:span)
       [AND resource = ANY(:resources)]
    """
    where: list[Any] = [device_bookings.c.pool_id == pool_id, device_bookings.c.during.op("&&")(span)]
    if not lease:
        classes = sorted({d.device_class for d in request.devices})
        where.append(devices.c["class"] == sa.any_(sa.literal(classes, pg.ARRAY(sa.Text))))
    bookings: dict[str, dict[str, list[tuple[datetime, datetime]]]] = {}
    if lease or request.devices:
        order = (device_bookings.c.device_id, device_bookings.c.during)  # per atom in time order
        stmt = (
            sa.select(
                devices.c.node_id,
                _raw_array(pg.aggregate_order_by(device_bookings.c.device_id, *order)),
                _raw_array(pg.aggregate_order_by(sa.func.lower(device_bookings.c.during), *order)),
                _raw_array(pg.aggregate_order_by(sa.func.upper(device_bookings.c.during), *order)),
            )
            .join(devices, devices.c.pk == device_bookings.c.device_pk)
            .where(*where)
            .group_by(devices.c.node_id)
        )
        for node_id, atom_ids, starts, ends in (await conn.execute(stmt)).all():
            per_atom: dict[str, list[tuple[datetime, datetime]]] = {}
            for atom_id, held in zip(atom_ids, zip(starts, ends, strict=True), strict=True):
                per_atom.setdefault(atom_id, []).append(held)
            bookings[node_id] = per_atom
    scalars: dict[str, dict[str, list[Held]]] = defaultdict(lambda: defaultdict(list))
    if lease or request.resources:
        held_where: list[Any] = [
            scalar_holdings.c.pool_id == pool_id,
            scalar_holdings.c.ends_at > span.lower,
            scalar_holdings.c.starts_at < span.upper,
        ]
        if not lease:
            held_where.append(scalar_holdings.c.resource.in_(sorted(request.resources)))
        for r in (
            await conn.execute(
                sa.select(
                    scalar_holdings.c.node_id,
                    scalar_holdings.c.resource,
                    scalar_holdings.c.amount,
                    scalar_holdings.c.starts_at,
                    scalar_holdings.c.ends_at,
                ).where(*held_where)
            )
        ).all():
            scalars[r.node_id][r.resource].append(Held(r.starts_at, r.ends_at, Decimal(r.amount)))
    return {
        node_id: NodeHoldings(bookings.get(node_id, {}), scalars.get(node_id, {}))
        for node_id in bookings.keys() | scalars.keys()
    }


async def _quota_room(conn: AsyncConnection, request: PlacementRequest, span: Any) -> QuotaRoom:
    """The tenant's limits in the pool for what the request charges, and its holdings of the limited
    resources overlapping ``span`` (docs/quota.md)::

    SELECT resource, "limit" FROM quota_limits
     WHERE tenant_id = :tenant AND pool_id = :pool AND resource = ANY(:charged)
    SELECT resource, amount, starts_at, ends_at FROM quota_holdings
     WHERE tenant_id = :tenant AND pool_id = :pool AND resource = ANY(:limited)
       AND ends_at > lower(:span) AND starts_at < upper(:span)
    """
    wanted = quota_amounts(request)
    limits = {
        r.resource: Decimal(r.limit)
        for r in (
            await conn.execute(
                sa.select(quota_limits.c.resource, quota_limits.c.limit).where(
                    quota_limits.c.tenant_id == request.tenant_id,
                    quota_limits.c.pool_id == request.pool_id,
                    quota_limits.c.resource.in_(sorted(wanted)),
                )
            )
        ).all()
    }
    held: dict[str, list[Held]] = defaultdict(list)
    if limits:
        for r in (
            await conn.execute(
                sa.select(
                    quota_holdings.c.resource,
                    quota_holdings.c.amount,
                    quota_holdings.c.starts_at,
                    quota_holdings.c.ends_at,
                ).where(
                    quota_holdings.c.tenant_id == request.tenant_id,
                    quota_holdings.c.pool_id == request.pool_id,
                    quota_holdings.c.resource.in_(sorted(limits)),
                    quota_holdings.c.ends_at > span.lower,
                    quota_holdings.c.starts_at < span.upper,
                )
            )
        ).all():
            held[r.resource].append(Held(r.starts_at, r.ends_at, Decimal(r.amount)))
    return QuotaRoom(limits, {r: wanted[r] for r in limits}, dict(held))
