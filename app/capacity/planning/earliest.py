"""The earliest window of a request: one read of what the pool holds over the searched span, the pure
search for candidate starts (:mod:`app.placement.earliest`), then the placement pipeline at each candidate
in increasing order until one fits (docs/lifecycle.md, "Earliest start").

Reads, all plain (no locks; a create commits what it finds through the guarded commit, which decides):

- the pool head and its cached static inventory, and each node's state that is not a window (NoSchedule
  reasons, leasable, unhealthy or unbookable atoms), as it is now;
- what holds each node across the requested start ``T0`` (bookings of the requested classes, per node
  and class: how many atoms, their first and last end), for each node's lower bound;
- per span of starts ``[T0, span_end]`` (see :func:`find_earliest`): the tenant's quota holdings of the
  charged resources that have a limit, with the limits, overlapping ``[T0, span_end + d)`` (``d`` the
  duration); and, node batch by node batch (lowest bound first), the nodes' bookings and scalar holdings
  of the requested resources (every resource for a lease) overlapping it;
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
from app.db.tables import (
    allocations,
    device_bookings,
    devices,
    nodes,
    quota_holdings,
    quota_limits,
    scalar_holdings,
)
from app.db.windows import holdings_over, window
from app.placement.earliest import (
    BusyAtFirst,
    EarliestSearch,
    Held,
    NodeHoldings,
    QuotaRoom,
    class_counts,
    node_bound,
)
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
NODE_BATCH = 256  # nodes whose intervals one read brings, lowest bound first
CLASS_COUNTS = "earliest.class_counts"  # the inventory memo's key of each node's atoms per class


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

    What is read follows how soon the answer lies, not how far ahead the pool is booked:

    - starts are searched in spans from ``request.start``: one day (:data:`FIRST_SPAN`), then each span
      twice as long, up to the lead. A span's search reads only the intervals overlapping it (plus the
      window's length), and its candidates are exactly the wider search's candidates within it;
    - within a span, nodes are added to the search lowest bound first (:func:`~app.placement.earliest.
      node_bound`, from one read of what holds each node at ``request.start``), :data:`NODE_BATCH` at a
      time, and a candidate is taken only when it lies below the bound of every node not added yet, so
      the intervals of nodes that cannot hold the request that early are never read."""
    assert request.start is not None and request.end is not None
    head = head or await read_pool_head(conn, request.pool_id)
    if head.archived:
        return NoWindow(ARCHIVED_POOL)
    last = now + config.max_lead
    duration = request.end - request.start
    inventory = await cache.inventory(conn, head)
    states = await _node_states(conn, head.id)
    busy = await _busy_at_first(conn, head.id, request)
    counts = inventory.memo.get(CLASS_COUNTS)
    if counts is None:  # static: once per inventory version
        counts = inventory.memo[CLASS_COUNTS] = {n: class_counts(inventory.nodes[n]) for n in inventory.order}
    bounds: list[tuple[datetime, str]] = []
    for node_id in inventory.order:
        bound = node_bound(counts[node_id], request, busy.get(node_id, {}))
        if bound is not None:
            bounds.append((bound, node_id))
    bounds.sort()
    plans = 0
    searched: datetime | None = None  # the starts up to here were candidates of an earlier span
    span = FIRST_SPAN
    while True:
        span_end = min(request.start + span, last)
        reach = window(request.start, span_end + duration)
        found = EarliestSearch(request, await _quota_room(conn, request, reach), span_end)
        pending = [node_id for bound, node_id in bounds if bound <= span_end]
        added = 0
        while True:
            before = bounds[added][0] if added < len(pending) else None
            start = found.next_start(before)
            if start is None:
                if added >= len(pending):
                    break
                batch = pending[added : added + NODE_BATCH]
                added += len(batch)
                holdings = await _node_holdings(conn, request, reach, batch)
                for node_id in batch:
                    node = NodeSnapshot(inventory.nodes[node_id], states.get(node_id, NodeState()))
                    found.add(
                        node, inventory.capacities.get(node_id, {}), holdings.get(node_id, NodeHoldings())
                    )
                continue
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


async def _node_states(conn: AsyncConnection, pool_id: str) -> dict[str, NodeState]:
    """The state that is not a window of the pool's nodes that have any, as it is now (the search
    assumes it at every start); a node absent has none (schedulable, leasable, every atom available)::

    SELECT id, no_schedule_reasons, leasable FROM nodes
     WHERE pool_id = :pool AND (no_schedule_reasons <> '{}' OR NOT leasable)
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
    no_reasons = sa.literal([], pg.ARRAY(sa.Text))
    rows = (
        await conn.execute(
            sa.select(nodes.c.id, nodes.c.no_schedule_reasons, nodes.c.leasable).where(
                nodes.c.pool_id == pool_id,
                nodes.c.deleted_at.is_(None),
                sa.or_(nodes.c.no_schedule_reasons != no_reasons, sa.not_(nodes.c.leasable)),
            )
        )
    ).all()
    states = {node_id: NodeState(unavailable=frozenset(atoms)) for node_id, atoms in unavailable.items()}
    for r in rows:
        states[r.id] = NodeState(
            tuple(r.no_schedule_reasons), r.leasable, frozenset(unavailable.get(r.id, ()))
        )
    return states


def _raw_array(expr: Any) -> Any:
    """``array_agg(expr)`` decoded by asyncpg and passed through untouched (many bookings)."""
    return sa.func.array_agg(expr, type_=sa.types.NullType())


async def _busy_at_first(
    conn: AsyncConnection, pool_id: str, request: PlacementRequest
) -> dict[str, dict[str, BusyAtFirst]]:
    """node id -> device class -> the atoms booked across ``request.start`` (every class under ``""``
    for a lease), for :func:`~app.placement.earliest.node_bound`::

    SELECT d.node_id, d.class, count(*), min(upper(b.during)), max(upper(b.during))
      FROM device_bookings b JOIN devices d ON d.pk = b.device_pk
     WHERE b.pool_id = :pool AND b.during @> :start [AND d.class = ANY(:classes)]
     GROUP BY d.node_id, d.class
    """
    lease = request.binding == NODE_BINDING
    where: list[Any] = [
        device_bookings.c.pool_id == pool_id,
        device_bookings.c.during.op("@>")(request.start),
    ]
    if not lease:
        if not request.devices:
            return {}
        where.append(devices.c["class"].in_(sorted({d.device_class for d in request.devices})))
    upper = sa.func.upper(device_bookings.c.during)
    per_class = (
        sa.select(
            devices.c.node_id.label("node_id"),
            devices.c["class"].label("device_class"),
            sa.func.count().label("atoms"),
            sa.func.min(upper).label("first_end"),
            sa.func.max(upper).label("last_end"),
        )
        .join(devices, devices.c.pk == device_bookings.c.device_pk)
        .where(*where)
        .group_by(devices.c.node_id, devices.c["class"])
        .subquery()
    )
    # one row of arrays, decoded by asyncpg: a pool may have every node busy at the start
    row = (await conn.execute(sa.select(*(_raw_array(c) for c in per_class.c)).select_from(per_class))).one()
    busy: dict[str, dict[str, BusyAtFirst]] = {}
    for node_id, device_class, count, first_end, last_end in zip(*(c or () for c in row), strict=True):
        key = "" if lease else device_class
        held = busy.setdefault(node_id, {})
        known = held.get(key)
        if known is not None:  # a lease: the classes together
            count = count + known.atoms
            first_end, last_end = min(first_end, known.first_end), max(last_end, known.last_end)
        held[key] = BusyAtFirst(count, first_end, last_end)
    return busy


async def _node_holdings(
    conn: AsyncConnection, request: PlacementRequest, span: Any, node_ids: list[str]
) -> dict[str, NodeHoldings]:
    """node id -> its bookings (per atom, in time order) and scalar holdings (of the requested resources;
    every resource for a lease) overlapping ``span``, for ``node_ids``; reached through the allocations'
    and holdings' node indexes::

    SELECT a.node_id, array_agg(b.device_id ORDER BY b.device_id, b.during), array_agg(lower(b.during) ...),
           array_agg(upper(b.during) ...)
      FROM allocations a JOIN device_bookings b ON b.allocation_id = a.id
     WHERE a.node_id = ANY(:nodes) AND a.during && :span AND b.during && :span
     GROUP BY a.node_id
    SELECT node_id, resource, amount, starts_at, ends_at FROM scalar_holdings
     WHERE node_id = ANY(:nodes) AND ends_at > lower(:span) AND starts_at < upper(:span)
       [AND resource = ANY(:resources)]
    """
    lease = request.binding == NODE_BINDING
    bookings: dict[str, dict[str, list[tuple[datetime, datetime]]]] = {}
    if lease or request.devices:
        order = (device_bookings.c.device_id, device_bookings.c.during)  # per atom in time order
        stmt = (
            sa.select(
                allocations.c.node_id,
                _raw_array(pg.aggregate_order_by(device_bookings.c.device_id, *order)),
                _raw_array(pg.aggregate_order_by(sa.func.lower(device_bookings.c.during), *order)),
                _raw_array(pg.aggregate_order_by(sa.func.upper(device_bookings.c.during), *order)),
            )
            .join(device_bookings, device_bookings.c.allocation_id == allocations.c.id)
            .where(
                allocations.c.node_id.in_(node_ids),
                allocations.c.during.op("&&")(span),
                device_bookings.c.during.op("&&")(span),
            )
            .group_by(allocations.c.node_id)
        )
        for node_id, atom_ids, starts, ends in (await conn.execute(stmt)).all():
            per_atom: dict[str, list[tuple[datetime, datetime]]] = {}
            for atom_id, held in zip(atom_ids, zip(starts, ends, strict=True), strict=True):
                per_atom.setdefault(atom_id, []).append(held)
            bookings[node_id] = per_atom
    scalars: dict[str, dict[str, list[Held]]] = defaultdict(lambda: defaultdict(list))
    if lease or request.resources:
        held_where: list[Any] = [scalar_holdings.c.node_id.in_(node_ids)]
        if not lease:
            held_where.append(scalar_holdings.c.resource.in_(sorted(request.resources)))
        stmt = holdings_over(
            scalar_holdings, span.lower, span.upper, *held_where, keys=(scalar_holdings.c.node_id,)
        )
        for r in (await conn.execute(stmt)).all():
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
        stmt = holdings_over(
            quota_holdings,
            span.lower,
            span.upper,
            quota_holdings.c.tenant_id == request.tenant_id,
            quota_holdings.c.pool_id == request.pool_id,
            quota_holdings.c.resource.in_(sorted(limits)),
        )
        for r in (await conn.execute(stmt)).all():
            held[r.resource].append(Held(r.starts_at, r.ends_at, Decimal(r.amount)))
    return QuotaRoom(limits, {r: wanted[r] for r in limits}, dict(held))
