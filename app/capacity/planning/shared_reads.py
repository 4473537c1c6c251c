"""The reads a batch's plans share (docs/architecture.md, "planning"; issue 15).

A batch (:mod:`app.capacity.placing.batch`) plans its entries on reads they share (:class:`SharedReads`): one
exceptions read per (window, resource names, tenant) group (:class:`WindowGroup`), the batch's earlier
plans counted in (:class:`BatchPlanned`), the touched nodes' scores, the inside nodes' states and the
pipeline's per-node outcomes memoized until a plan or an assumption changes the node (the outcomes under
keys the pipeline derives from what its filters and scorers declare they read, docs/extending.md, "What
a filter reads"). A worker keeps a pool's groups warm for its next batch (:class:`WarmReads`, one
:class:`WarmSlot` per pool) for ``WARM_SECONDS``. The guarded commit still decides, as for a plan of its
own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.planning.exceptions import (
    INSIDE_SCALARS_READ,
    ExceptionRows,
    exceptions_params,
    read_exception_rows,
)
from app.capacity.planning.snapshot import (
    PoolCache,
    PoolHead,
)
from app.capacity.predicates import tolerated_reasons
from app.placement.model import (
    NodeSnapshot,
    NodeState,
    PlacementRequest,
    PoolInventory,
    PoolSnapshot,
    ScalarResource,
)
from app.placement.pipeline import NodeMemos
from app.placement.scalar_capacity import scalar_capacity
from app.placement.shortlist import (
    Exceptions,
)


@dataclass(frozen=True, slots=True)
class BatchPlanned:
    """An earlier plan of a batch, not committed yet: the atoms and scalar amounts it takes on its node
    over ``[start, end)``."""

    node_id: str
    atoms: frozenset[str]
    resources: Mapping[str, Decimal]
    start: datetime
    end: datetime


GroupKey = tuple[datetime, datetime, tuple[str, ...], tuple[str, ...]]


def group_key(request: PlacementRequest) -> GroupKey:
    """The requests that share one exceptions read: (start, end, resource names, tolerated reasons)."""
    assert request.start is not None and request.end is not None
    return (
        request.start,
        request.end,
        tuple(sorted(request.resources)),
        tuple(tolerated_reasons(request.tenant_id)),
    )


@dataclass
class WindowGroup:
    """One exceptions read of a batch and the batch's plans over it: ``booked`` holds the read's
    bookings, the process's assumptions at read time and the overlapping plans' atoms; ``extra`` node id
    -> resource -> the overlapping plans' amounts; ``scalars`` the ``node_resources`` rows with their
    peaks over the window read so far (:data:`INSIDE_SCALARS`, without ``extra``)."""

    cache: PoolCache
    pool_id: str
    start: datetime
    end: datetime
    names: list[str]
    rows: ExceptionRows
    booked: dict[str, set[str]]
    mark: int  # the cache's newest assumption token when the rows were read (PoolCache.assumed_after)
    most: Decimal = Decimal(0)  # the largest amount of a resource the exceptions read judged room for
    read_at: float = 0.0  # time.monotonic() of the exceptions read (WarmReads' age bound)
    extra: dict[str, dict[str, Decimal]] = field(default_factory=dict)
    scalars: dict[str, dict[str, ScalarResource]] = field(default_factory=dict)
    changes: list[str] = field(default_factory=list)  # node ids changed, in order (touched_scores)
    memo: dict[Any, tuple[int, dict[str, float | None]]] = field(default_factory=dict)
    states: dict[str, NodeState] = field(default_factory=dict)  # inside states of nodes not changed
    snapshots: dict[str, NodeSnapshot] = field(default_factory=dict)
    # the pipeline's per-node outcomes, under keys it derives from what filters and scorers declare
    node_memos: NodeMemos = field(default_factory=dict)

    def take(self, planned: BatchPlanned) -> None:
        """Count an earlier plan of the batch when its window overlaps this group's."""
        if planned.start < self.end and self.start < planned.end:
            self.booked.setdefault(planned.node_id, set()).update(planned.atoms)
            self.changed(planned.node_id)
            held = self.extra.setdefault(planned.node_id, {})
            for resource, n in planned.resources.items():
                held[resource] = held.get(resource, Decimal(0)) + Decimal(n)

    def carry(self) -> None:
        """The batch that planned on this group committed: its plans stay counted (their atoms in
        ``booked``; their amounts in ``extra`` for the nodes whose scalar rows were read before them).
        A node whose rows are not read yet drops its ``extra``: the read a later batch makes sees the
        committed holdings themselves."""
        for node_id in [n for n in self.extra if n not in self.scalars]:
            del self.extra[node_id]
            self.changed(node_id)

    def catch_up(self) -> None:
        """Count as booked what other plans of this process assumed since the last catch-up (called
        again after each await before a plan, so no plan of another transaction slips in between)."""
        newer, self.mark = self.cache.assumed_after(self.pool_id, self.mark, self.start, self.end)
        for node_id, atoms in newer.items():
            self.booked.setdefault(node_id, set()).update(atoms)
            self.changed(node_id)

    def changed(self, node_id: str) -> None:
        """The node's bookings or held amounts changed: memoized scores and states of it are stale."""
        self.changes.append(node_id)
        self.states.pop(node_id, None)

    def touched_scores(
        self, key: Any, touched: Iterable[str], score: Callable[[str], float | None]
    ) -> dict[str, float | None]:
        """``score`` of every touched node for requests of shape ``key``, memoized: recomputed only for
        the nodes changed since the last call with ``key`` (every changed node is touched)."""
        found = self.memo.get(key)
        if found is None:
            scores = {node_id: score(node_id) for node_id in touched}
        else:
            seen, scores = found
            for node_id in set(self.changes[seen:]):
                scores[node_id] = score(node_id)
        self.memo[key] = (len(self.changes), scores)
        return scores

    async def fetch(self, conn: AsyncConnection, node_ids: Iterable[str], ahead: Iterable[str] = ()) -> None:
        """Read the scalar rows of the nodes not read yet (one statement, none when all are), and with
        them those of ``ahead`` (the next nodes of the ranking: plans after this one reach for them)."""
        missing = {n for n in node_ids if n not in self.scalars}
        if not missing or not self.names:
            return
        missing = sorted(missing | {n for n in ahead if n not in self.scalars})
        params = {"inside": missing, "names": self.names, "starts_at": self.start, "ends_at": self.end}
        for node_id in missing:
            self.scalars[node_id] = {}
            self.states.pop(node_id, None)
        for r in (await INSIDE_SCALARS_READ.run(conn, params)).all():
            self.scalars[r.node_id][r.resource] = ScalarResource(r.allocatable, r.ratio, r.held)

    def snapshot(self, inventory: PoolInventory, node_id: str, state: NodeState) -> NodeSnapshot:
        """The node as the pipeline sees it, the same object while its inventory and state are."""
        found = self.snapshots.get(node_id)
        node = inventory.nodes[node_id]
        if found is None or found.state is not state or found.inventory is not node:
            found = self.snapshots[node_id] = NodeSnapshot(node, state)
        return found

    def state(self, node_id: str) -> NodeState:
        """The node's volatile state as a plan of this group sees it (memoized until it changes)."""
        found = self.states.get(node_id)
        if found is None:
            found = self.states[node_id] = NodeState(
                no_schedule_reasons=self.rows.reasons.get(node_id, ()),
                unavailable=frozenset(self.rows.unavailable.get(node_id, ())),
                booked=frozenset(self.booked.get(node_id, ())),
                resources=self.resources(node_id),
            )
        return found

    def resources(self, node_id: str) -> dict[str, ScalarResource]:
        """The node's scalar rows as a plan of this group sees them: the peak read plus the batch's."""
        rows = self.scalars.get(node_id, {})
        extra = self.extra.get(node_id)
        if not extra:
            return rows
        return {r: replace(s, allocated=s.allocated + extra.get(r, Decimal(0))) for r, s in rows.items()}


WARM_SECONDS = 0.5  # a batch plans on the exceptions read of an earlier batch of the pool this long
# a warm group reads its window's end this much later: the next batches' windows ("start now") fit in it
WARM_SLACK = timedelta(seconds=5)


@dataclass
class WarmReads:
    """The groups of a pool's last committed batch, for the next batch of the same worker (issue 15):
    their exceptions read, the process's assumptions caught up with, and every committed plan of the
    batches since counted, so the next batch of an unchanged pool sends no exceptions read.

    Usable (:meth:`usable`) while the pool's inventory version is the one read, for a group read less
    than ``WARM_SECONDS`` ago whose ``most`` covers the new batch's largest amount. What it misses
    (bookings and holdings committed elsewhere since the read, bookings released, atoms turned
    unhealthy) is what any plan on an earlier read misses: the guarded commit catches what was booked
    meanwhile (the loser replans on fresh reads), a released booking is seen again at the next read.
    A pending decision is never made on it: a shortlist plan that finds no room goes to the whole-pool
    read of its transaction."""

    version: int
    groups: dict[GroupKey, WindowGroup]

    def usable(self, head: PoolHead, most: Mapping[tuple[Any, ...], Decimal]) -> dict[GroupKey, WindowGroup]:
        """The groups a batch of ``head`` (its pool row, locked) may plan on: ``most`` is the batch's
        largest amount per (resource names, tolerated reasons), which the group's read must cover."""
        if head.inventory_version != self.version or head.archived:
            return {}
        now = time.monotonic()
        return {
            key: g
            for key, g in self.groups.items()
            if now - g.read_at < WARM_SECONDS and most.get(key[2:], Decimal(0)) <= g.most
        }


@dataclass
class WarmSlot:
    """Where a worker keeps a pool's :class:`WarmReads` between its batches (``reads`` None: read
    afresh). :func:`app.capacity.placing.batch.place_batch` takes them and leaves the next ones; the caller
    clears ``reads`` when the batch's transaction did not commit. ``usage``: the ``(tenant, pool,
    resource)`` of the ``quota_usage`` rows known to exist (never deleted; one missing all the same is
    found by the count and inserted), so a batch locks every tenant's rows in one statement."""

    reads: WarmReads | None = None
    usage: set[tuple[str, str, str]] = field(default_factory=set)  # quota_usage rows known to exist


class SharedReads:
    """The reads the plans of one batch attempt share (one pool, one transaction; issue 15): one
    exceptions read per :func:`group_key` group (made with the group's largest ``most``, so it serves
    every amount of the group), each later plan of the batch seeing the earlier ones (:meth:`add`):
    their atoms as booked and their scalar amounts as held wherever the windows overlap (added to the
    window's peak: exact for equal windows, an upper bound for windows that overlap in part), and
    ``head`` (the pool row the batch locked) instead of a head read per plan.

    What other transactions book after a group's read is caught by the guarded commit, as for a plan
    made on a read of its own (the loser replans without the node, on fresh reads: a new attempt makes
    new ``SharedReads``). ``reads`` counts the exceptions reads (tests)."""

    def __init__(
        self,
        cache: PoolCache,
        head: PoolHead,
        requests: Iterable[PlacementRequest],
        warm: WarmReads | None = None,
        slack: timedelta = timedelta(0),
    ) -> None:
        self.cache = cache
        self.head = head
        self.reads = 0
        self.slack = slack
        self._most: dict[tuple[Any, ...], Decimal] = {}  # (names, tolerated) -> the batch's largest amount
        for r in requests:
            if r.resources:
                kind = group_key(r)[2:]
                self._most[kind] = max(self._most.get(kind, Decimal(0)), *map(Decimal, r.resources.values()))
        self._groups: dict[GroupKey, WindowGroup] = warm.usable(head, self._most) if warm is not None else {}
        self._planned: list[BatchPlanned] = []

    def warm(self) -> WarmReads:
        """This batch's groups for the next batch of the pool, once this batch's transaction committed
        with every plan made on them (none lost a race, none was refused or preempted)."""
        for group in self._groups.values():
            group.carry()
        return WarmReads(self.head.inventory_version, dict(self._groups))

    def add(self, planned: BatchPlanned) -> None:
        """A plan of the batch: the plans after it see it."""
        self._planned.append(planned)
        for group in self._groups.values():
            group.take(planned)

    def _covering(self, request: PlacementRequest) -> WindowGroup | None:
        """The group whose read serves ``request``: its own window's, else (with ``slack``) one of the
        same resource names and tenant whose read window contains the request's."""
        key = group_key(request)
        found = self._groups.get(key)
        if found is not None or not self.slack:
            return found
        start, end, *kind = key
        for (g_start, g_end, *g_kind), group in self._groups.items():
            if g_kind == kind and g_start <= start and end <= g_end:
                return group
        return None

    async def group(self, conn: AsyncConnection, request: PlacementRequest) -> WindowGroup:
        """The request's group, read on first use. With ``slack`` the read's window ends ``slack``
        later than the request's (an upper bound of what the request's window holds: more booked, a
        higher peak), so the requests of later batches, whose windows start a little later, fit in it."""
        found = self._covering(request)
        if found is None:
            start, end, names, tolerated = group_key(request)
            end = end + self.slack
            params = exceptions_params(replace(request, end=end))
            if names:
                params["most"] = self._most.get((names, tolerated), params["most"])
            # the assumptions live before the read (one may commit during it, after the read's snapshot)
            # and those made after the mark, caught up with before each plan
            live = self.cache.assumed(request.pool_id, start, end)
            mark = self.cache.newest()
            rows = await read_exception_rows(conn, params, bool(names))
            self.reads += 1
            booked = rows.booked
            for node_id, atoms in live.items():
                booked.setdefault(node_id, set()).update(atoms)
            most = Decimal(params.get("most", 0))
            found = WindowGroup(
                self.cache, request.pool_id, start, end, list(names), rows, booked, mark, most
            )
            found.read_at = time.monotonic()
            self._groups[(start, end, names, tolerated)] = found
            for planned in self._planned:
                found.take(planned)
        found.catch_up()
        return found

    async def exceptions(
        self, conn: AsyncConnection, request: PlacementRequest
    ) -> tuple[WindowGroup, Exceptions]:
        """The request's exceptions: its group's read judged with its amounts, plus the batch's plans
        (a node whose peak plus the batch's amounts leaves no room for the request is short)."""
        group = await self.group(conn, request)
        short, peaks = group.rows.scalar_short(request.resources)
        wanted = request.resources
        touched = [n for n, held in group.extra.items() if any(r in wanted for r in held)]
        await group.fetch(conn, touched)
        group.catch_up()
        for node_id in touched:
            for resource, s in group.resources(node_id).items():
                n = wanted.get(resource)
                if n is not None and s.allocated + Decimal(n) > scalar_capacity(s.allocatable, s.ratio):
                    short.add(node_id)
        rows = group.rows
        return group, Exceptions(
            booked=group.booked,
            unavailable=rows.unavailable,
            reasons=rows.reasons,
            unschedulable=rows.unschedulable,
            short=frozenset(short),
            peaks=peaks,
        )

    def overlay(self, snapshot: PoolSnapshot, request: PlacementRequest) -> PoolSnapshot:
        """A whole-pool snapshot read in the transaction with the batch's scalar amounts over the
        request's window added (its atoms come with the cache's assumptions already)."""
        assert request.start is not None and request.end is not None
        extra: dict[str, dict[str, Decimal]] = {}
        for p in self._planned:
            if p.start < request.end and request.start < p.end:
                held = extra.setdefault(p.node_id, {})
                for resource, n in p.resources.items():
                    held[resource] = held.get(resource, Decimal(0)) + Decimal(n)
        if not extra:
            return snapshot
        nodes_out = []
        for node in snapshot.nodes:
            more = extra.get(node.id)
            if more:
                resources = {
                    r: replace(s, allocated=s.allocated + more.get(r, Decimal(0)))
                    for r, s in node.state.resources.items()
                }
                node = replace(node, state=replace(node.state, resources=resources))
            nodes_out.append(node)
        return replace(snapshot, nodes=tuple(nodes_out))
