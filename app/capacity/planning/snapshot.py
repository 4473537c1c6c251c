"""Snapshot reads for the pipeline (docs/scaling.md).

The static part of a pool (nodes' names, labels, devices with attributes and NUMA nodes, links) is
cached in process per pool and ``pools.inventory_version``; every inventory change bumps the version in
its own transaction, so a request that reads a newer version reloads, and replicas stay correct. The
volatile part (NoSchedule reasons, unhealthy or unbookable atoms, bookings overlapping the window,
the peak of scalar holdings over the window) is read per request with narrow indexed queries. All reads
here are plain reads (no locks): plans are made on them and the guarded commit re-checks what they assumed.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import aggregate_order_by as pg_aggregate_order_by
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.locks import pool_not_found
from app.db.tables import (
    capacity_device_links,
    device_bookings,
    devices,
    node_labels,
    node_resources,
    nodes,
    pools,
    scalar_holdings,
)
from app.db.windows import peaks_by, window
from app.placement.model import (
    Atom,
    NodeInventory,
    NodeSnapshot,
    NodeState,
    PoolInventory,
    PoolSnapshot,
    ScalarResource,
    selectable_attributes,
)
from app.placement.scalar_capacity import scalar_capacity
from app.placement.topology import node_topology

ASSUME_LOG = 8192  # recent assumptions kept per pool for readers catching up (PoolCache.assumed_after)


@dataclass(frozen=True, slots=True)
class PoolHead:
    """The pool row as a request sees it: id, archived flag, inventory version."""

    id: str
    archived: bool
    inventory_version: int


@dataclass(frozen=True, slots=True)
class Assumption:
    """Atoms a plan in this process picked and is committing (see :meth:`PoolCache.assume`)."""

    node_id: str
    atoms: frozenset[str]
    start: datetime
    end: datetime


class PoolCache:
    """In-process cache of each pool's static inventory, keyed by pool id and inventory version.

    One per process; safe under asyncio (a per-pool lock makes concurrent misses load once).
    """

    def __init__(self) -> None:
        self._pools: dict[str, PoolInventory] = {}
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.loads = 0  # how many times a pool's static part was read (tests and benchmarks look)
        self._assumed: dict[str, dict[int, Assumption]] = defaultdict(dict)
        self._tokens = itertools.count(1)
        self._newest = 0
        # every recent assumption by token, forgotten or not (a reader catching up since a token)
        self._log: dict[str, deque[tuple[int, Assumption]]] = defaultdict(lambda: deque(maxlen=ASSUME_LOG))

    # Assumed bookings (the "assume" step of the Kubernetes scheduler cache): between a plan and the
    # commit of its transaction, the atoms it picked are treated as booked by every other plan made in
    # this process, so concurrent requests of one replica stop reaching for the same atoms and losing
    # races. It is only a hint that makes plans better: the guarded commit still decides, and other
    # replicas are caught by it as before.

    def assume(self, pool_id: str, node_id: str, atoms: Iterable[str], start: datetime, end: datetime) -> int:
        """Record ``atoms`` of ``node_id`` as being booked for ``[start, end)``; returns a token."""
        token = self._newest = next(self._tokens)
        assumption = Assumption(node_id, frozenset(atoms), start, end)
        self._assumed[pool_id][token] = assumption
        self._log[pool_id].append((token, assumption))
        return token

    def newest(self) -> int:
        """The token of the latest assumption (0: none yet): a mark for :meth:`assumed_after`."""
        return self._newest

    def forget(self, pool_id: str, token: int) -> None:
        """Drop an assumption (its transaction committed, rolled back, or lost the race)."""
        self._assumed[pool_id].pop(token, None)

    def assumed(self, pool_id: str, start: datetime, end: datetime) -> dict[str, set[str]]:
        """node id -> atoms assumed booked over a window overlapping ``[start, end)``."""
        out: dict[str, set[str]] = {}
        for a in self._assumed.get(pool_id, {}).values():
            if a.start < end and start < a.end:
                out.setdefault(a.node_id, set()).update(a.atoms)
        return out

    def assumed_after(
        self, pool_id: str, mark: int, start: datetime, end: datetime
    ) -> tuple[dict[str, set[str]], int]:
        """node id -> atoms of the assumptions made after the token ``mark`` over a window overlapping
        ``[start, end)``, still assumed or forgotten since (committed meanwhile, or lost: a reader
        whose rows were read before ``mark`` counts both), and the new mark. Only the last
        :data:`ASSUME_LOG` assumptions of a pool are kept: a reader further behind misses the oldest
        (a hint: the guarded commit still decides)."""
        out: dict[str, set[str]] = {}
        log = self._log.get(pool_id)
        if not log:
            return out, max(mark, self._newest)
        for token, a in reversed(log):
            if token <= mark:
                break
            if a.start < end and start < a.end:
                out.setdefault(a.node_id, set()).update(a.atoms)
        return out, max(mark, self._newest)

    async def inventory(self, conn: AsyncConnection, head: PoolHead) -> PoolInventory:
        """The static inventory of ``head.id`` at ``head.inventory_version`` (or newer)."""
        cached = self._pools.get(head.id)
        if cached is not None and cached.version >= head.inventory_version:
            return cached
        async with self._locks[head.id]:
            cached = self._pools.get(head.id)
            if cached is not None and cached.version >= head.inventory_version:
                return cached
            loaded = await load_pool_inventory(conn, head.id)
            for node in loaded.nodes.values():
                node_topology(node)  # link matrices built now, once per version, not in a request's plan
            self.loads += 1
            self._pools[head.id] = loaded
            return loaded

    def clear(self) -> None:
        """Forget every pool (tests)."""
        self._pools.clear()


async def read_pool_head(conn: AsyncConnection, pool_id: str) -> PoolHead:
    """``SELECT id, archived_at, inventory_version FROM pools WHERE id = :pool``; NotFound if absent."""
    row = (
        await conn.execute(
            sa.select(pools.c.id, pools.c.archived_at, pools.c.inventory_version).where(pools.c.id == pool_id)
        )
    ).first()
    if row is None:
        raise pool_not_found(pool_id)
    return PoolHead(row.id, row.archived_at is not None, row.inventory_version)


def _raw_array(expr: Any) -> Any:
    """``array_agg(expr)`` whose result asyncpg decodes and SQLAlchemy passes through untouched (its
    per-element processing costs more than the query on a 10,000-node pool)."""
    return sa.func.array_agg(expr, type_=sa.types.NullType())


async def load_pool_inventory(conn: AsyncConnection, pool_id: str) -> PoolInventory:
    """Read the whole static part of a pool (nodes, labels, devices, links, which scalar resources each
    node has) in six queries.

    The version is read first, so a change committed during the load makes the next request reload.
    """
    version, pool_name = (
        await conn.execute(sa.select(pools.c.inventory_version, pools.c.name).where(pools.c.id == pool_id))
    ).one()
    node_rows = (
        await conn.execute(
            sa.select(nodes.c.id, nodes.c.name)
            .where(nodes.c.pool_id == pool_id, nodes.c.deleted_at.is_(None))  # a deleted node is history
            .order_by(nodes.c.id)
        )
    ).all()
    labels: dict[str, dict[str, str]] = defaultdict(dict)
    sources: dict[str, dict[str, str]] = defaultdict(dict)
    for r in (
        await conn.execute(
            sa.select(node_labels.c.node_id, node_labels.c.key, node_labels.c.value, node_labels.c.source)
            .join(nodes, nodes.c.id == node_labels.c.node_id)
            .where(nodes.c.pool_id == pool_id)
        )
    ).all():
        labels[r.node_id][r.key] = r.value
        sources[r.node_id][r.key] = r.source
    # One row per node with its atoms and links as arrays: 10,000 rows instead of 80,000 device rows
    # and 280,000 link rows, decoded by asyncpg in C. Attribute objects are parsed once per distinct
    # text and shared (nodes of one model carry identical attributes).
    atoms: dict[str, tuple[Atom, ...]] = {}
    parsed: dict[tuple[str, int | None], Mapping[str, Any]] = {}
    # SELECT d.node_id, array_agg(d.id ORDER BY d.ordinal, d.id), array_agg(d.class ...),
    #        array_agg(d.attributes::text ...), array_agg(d.numa_node ...), array_agg(d.parent_id ...)
    #   FROM devices d JOIN nodes n ON n.id = d.node_id WHERE n.pool_id = :pool GROUP BY d.node_id
    order = (devices.c.ordinal, devices.c.id)
    for r in (
        await conn.execute(
            sa.select(
                devices.c.node_id,
                _raw_array(pg_aggregate_order_by(devices.c.id, *order)),
                _raw_array(pg_aggregate_order_by(devices.c["class"], *order)),
                _raw_array(pg_aggregate_order_by(sa.cast(devices.c.attributes, sa.Text), *order)),
                _raw_array(pg_aggregate_order_by(devices.c.numa_node, *order)),
                _raw_array(pg_aggregate_order_by(devices.c.parent_id, *order)),
            )
            .join(nodes, nodes.c.id == devices.c.node_id)
            .where(nodes.c.pool_id == pool_id)
            .group_by(devices.c.node_id)
        )
    ).all():
        node_id, ids, classes, attribute_texts, numa, parents = r
        node_atoms = []
        for atom_id, device_class, text, numa_node, parent in zip(
            ids, classes, attribute_texts, numa, parents, strict=True
        ):
            # what a selector reads: the stored attributes with the NUMA node as ``numaNode``, however the
            # device was registered (docs/selectors.md); parsed once per (text, NUMA node)
            attributes = parsed.get((text, numa_node))
            if attributes is None:
                attributes = parsed[(text, numa_node)] = selectable_attributes(
                    json.loads(text) if text else {}, numa_node
                )
            node_atoms.append(Atom(atom_id, device_class, attributes, numa_node, parent))
        atoms[node_id] = tuple(node_atoms)
    links: dict[str, dict[tuple[str, str], str]] = {}
    # SELECT node_id, array_agg(a), array_agg(b), array_agg(link) FROM capacity_device_links ...
    #  GROUP BY node_id
    for node_id, a_ids, b_ids, kinds in (
        await conn.execute(
            sa.select(
                capacity_device_links.c.node_id,
                _raw_array(capacity_device_links.c.a),
                _raw_array(capacity_device_links.c.b),
                _raw_array(capacity_device_links.c.link),
            )
            .join(nodes, nodes.c.id == capacity_device_links.c.node_id)
            .where(nodes.c.pool_id == pool_id)
            .group_by(capacity_device_links.c.node_id)
        )
    ).all():
        links[node_id] = dict(zip(zip(a_ids, b_ids, strict=True), kinds, strict=True))
    names: dict[str, set[str]] = defaultdict(set)
    capacities: dict[str, dict[str, Decimal]] = defaultdict(dict)
    # SELECT nr.node_id, nr.resource, nr.allocatable, nr.ratio FROM node_resources nr
    #   JOIN nodes n ON n.id = nr.node_id WHERE n.pool_id = :pool
    for r in (
        await conn.execute(
            sa.select(
                node_resources.c.node_id,
                node_resources.c.resource,
                node_resources.c.allocatable,
                node_resources.c.ratio,
            )
            .join(nodes, nodes.c.id == node_resources.c.node_id)
            .where(nodes.c.pool_id == pool_id)
        )
    ).all():
        names[r.node_id].add(r.resource)
        capacities[r.node_id][r.resource] = scalar_capacity(r.allocatable, r.ratio)
    inventory = {
        r.id: NodeInventory(
            id=r.id,
            name=r.name,
            labels=dict(labels.get(r.id, {})),
            label_sources=dict(sources.get(r.id, {})),
            atoms=atoms.get(r.id, ()),
            links=links.get(r.id, {}),
        )
        for r in node_rows
    }
    return PoolInventory(
        version=version,
        nodes=inventory,
        order=tuple(r.id for r in node_rows),
        resource_names={r.id: frozenset(names.get(r.id, ())) for r in node_rows},
        capacities={r.id: dict(capacities.get(r.id, {})) for r in node_rows},
        name=pool_name,
    )


async def read_node_states(
    conn: AsyncConnection,
    pool_id: str,
    start: datetime,
    end: datetime,
    node_ids: Iterable[str] | None = None,
    assumed: Mapping[str, set[str]] | None = None,
    ignoring: Sequence[str] = (),
) -> dict[str, NodeState]:
    """The volatile state of the pool's nodes (or of ``node_ids``) for the window ``[start, end)``;
    ``assumed`` atoms (node id -> atoms other plans of this process are committing) count as booked; the
    bookings and scalar holdings of the allocations ``ignoring`` (ids) do not count (a what-if read:
    :mod:`app.capacity.planning.planned`)."""
    ids = list(node_ids) if node_ids is not None else None
    node_filter: list[Any] = [nodes.c.pool_id == pool_id, nodes.c.deleted_at.is_(None)]
    if ids is not None:
        node_filter.append(nodes.c.id.in_(ids))
    base_rows = (
        await conn.execute(
            sa.select(nodes.c.id, nodes.c.no_schedule_reasons, nodes.c.leasable).where(*node_filter)
        )
    ).all()
    # SELECT d.node_id, d.id FROM devices d JOIN nodes n ON n.id = d.node_id
    #  WHERE n.pool_id = :pool AND NOT (d.healthy AND d.bookable)
    unavailable: dict[str, set[str]] = defaultdict(set)
    for r in (
        await conn.execute(
            sa.select(devices.c.node_id, devices.c.id)
            .join(nodes, nodes.c.id == devices.c.node_id)
            .where(*node_filter, sa.not_(sa.and_(devices.c.healthy, devices.c.bookable)))
        )
    ).all():
        unavailable[r.node_id].add(r.id)
    # SELECT d.node_id, b.device_id FROM device_bookings b JOIN devices d ON d.pk = b.device_pk
    #  WHERE b.pool_id = :pool AND b.during && tstzrange(:start, :end)
    booked: dict[str, set[str]] = defaultdict(set)
    booking_filter: list[Any] = [
        device_bookings.c.pool_id == pool_id,
        device_bookings.c.during.op("&&")(window(start, end)),
    ]
    if ids is not None:
        booking_filter.append(devices.c.node_id.in_(ids))
    if ignoring:
        booking_filter.append(device_bookings.c.allocation_id.not_in(list(ignoring)))
    for r in (
        await conn.execute(
            sa.select(devices.c.node_id, device_bookings.c.device_id)
            .join(devices, devices.c.pk == device_bookings.c.device_pk)
            .where(*booking_filter)
        )
    ).all():
        booked[r.node_id].add(r.device_id)
    for node_id, atoms in (assumed or {}).items():
        booked[node_id].update(atoms)
    holders: list[Any] = [scalar_holdings.c.pool_id == pool_id]
    if ids is not None:
        holders.append(scalar_holdings.c.node_id.in_(ids))
    if ignoring:
        holders.append(scalar_holdings.c.allocation_id.not_in(list(ignoring)))
    resources = await read_scalar_rows(conn, node_filter, holders, start, end, join_nodes=True)
    return {
        r.id: NodeState(
            no_schedule_reasons=tuple(r.no_schedule_reasons),
            leasable=r.leasable,
            unavailable=frozenset(unavailable.get(r.id, ())),
            booked=frozenset(booked.get(r.id, ())),
            resources=resources.get(r.id, {}),
        )
        for r in base_rows
    }


def scalar_peaks(holders: list[Any], start: datetime, end: datetime) -> Any:
    """Subquery ``(node_id, resource, peak)``: the most each node holds of each resource at any instant of
    ``[start, end)``, over the ``scalar_holdings`` rows matching ``holders`` (app/db/windows.py)."""
    return peaks_by(
        scalar_holdings, holders, start, end, (scalar_holdings.c.node_id, scalar_holdings.c.resource)
    )


def scalar_rows_sql(
    where: list[Any], holders: list[Any], start: Any, end: Any, *, join_nodes: bool = False
) -> sa.Select[Any]:
    """The ``node_resources`` rows matching ``where`` (joined to ``nodes`` when the condition names node
    columns), each with ``held``: the peak held over ``[start, end)`` by the holdings matching
    ``holders`` (:func:`scalar_peaks`), so the pipeline's room is the room over the window::

        SELECT nr.node_id, nr.resource, nr.allocatable, nr.ratio, coalesce(p.peak, 0) AS held
          FROM node_resources nr [JOIN nodes n ON n.id = nr.node_id]
          LEFT JOIN (<peaks per node and resource over the window>) p
            ON p.node_id = nr.node_id AND p.resource = nr.resource
         WHERE <where>

    ``start``, ``end`` and the conditions may be bind parameters: a statement built once at import
    (app.capacity.planning.exceptions, ``INSIDE_SCALARS``)."""
    peaks = scalar_peaks(holders, start, end)
    source: Any = node_resources
    if join_nodes:
        source = source.join(nodes, nodes.c.id == node_resources.c.node_id)
    source = source.outerjoin(
        peaks,
        sa.and_(peaks.c.node_id == node_resources.c.node_id, peaks.c.resource == node_resources.c.resource),
    )
    return (
        sa.select(
            node_resources.c.node_id,
            node_resources.c.resource,
            node_resources.c.allocatable,
            node_resources.c.ratio,
            sa.func.coalesce(peaks.c.peak, 0).label("held"),
        )
        .select_from(source)
        .where(*where)
    )


async def read_scalar_rows(
    conn: AsyncConnection,
    where: list[Any],
    holders: list[Any],
    start: datetime,
    end: datetime,
    *,
    join_nodes: bool,
) -> dict[str, dict[str, ScalarResource]]:
    """node id -> resource -> :class:`ScalarResource` of the rows :func:`scalar_rows_sql` reads, its
    ``allocated`` the peak held over the window."""
    stmt = scalar_rows_sql(where, holders, start, end, join_nodes=join_nodes)
    resources: dict[str, dict[str, ScalarResource]] = defaultdict(dict)
    for r in (await conn.execute(stmt)).all():
        resources[r.node_id][r.resource] = ScalarResource(r.allocatable, r.ratio, r.held)
    return resources


async def read_snapshot(
    conn: AsyncConnection,
    cache: PoolCache,
    pool_id: str,
    start: datetime,
    end: datetime,
    node_ids: Iterable[str] | None = None,
    head: PoolHead | None = None,
    ignoring: Sequence[str] = (),
) -> tuple[PoolHead, PoolSnapshot]:
    """The pool head (read unless given) and a :class:`PoolSnapshot` (whole pool, or ``node_ids``) for
    ``[start, end)``; the allocations ``ignoring`` (ids) hold nothing in it (:func:`read_node_states`)."""
    head = head or await read_pool_head(conn, pool_id)
    inventory = await cache.inventory(conn, head)
    assumed = cache.assumed(pool_id, start, end)
    states = await read_node_states(conn, pool_id, start, end, node_ids, assumed, ignoring)
    order = inventory.order if node_ids is None else tuple(n for n in inventory.order if n in states)
    snapshot_nodes = tuple(
        NodeSnapshot(inventory.nodes[node_id], states[node_id])
        for node_id in order
        if node_id in states and node_id in inventory.nodes
    )
    return head, PoolSnapshot(id=pool_id, archived=head.archived, nodes=snapshot_nodes)
