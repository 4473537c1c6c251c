"""The earliest start of a request: the candidate starts at which it may fit, in increasing order (the pure
half of docs/lifecycle.md, "Earliest start").

Where to look. Every holding of a pool is a half-open window ``[s, e)`` counted per instant (docs/quota.md,
"Usage is counted per instant"). If a request fits for ``[t, t + d)`` with ``t`` later than the requested
start ``T0`` and no holding it competes with ends in ``(t - e, t]``, every holding active at an instant of
``[t - e, t)`` is active at ``t`` too, so the earlier window holds no more at any instant than the later
one did at ``t``: it fits as well. So the earliest start is ``T0`` or an end instant of a holding
(a booking of a candidate atom, a scalar holding of a requested resource on the node, the tenant's quota
holding of a limited resource). Node state that is not a window (cordon, taints, health, labels) is taken
as it is now at every start.

What is searched here is a necessary condition, per node on that node's own holdings only: enough atoms
of each requested class (matching the selector, healthy and bookable now) free for the whole window,
``floor(allocatable x ratio)`` room for each requested scalar at every instant of the window,
schedulable for the tenant now (a lease: the lease rule, and nothing held on the node in the window), the
required node labels; and, tenant-wide, the quota at every instant of the window. A start where the
necessary condition holds is only a candidate: the I/O half runs the placement pipeline at it
(``app/capacity/planning/earliest.py``) and answers the first that fits.

Cost: a node with ``m`` relevant holdings is judged at ``m + 1`` starts (``T0`` and its own ends), each in
``O(a log m + m)`` for ``a`` candidate atoms; the quota test at a start is ``O(q)`` per limited resource
for ``q`` of the tenant's holdings. Starts are produced lazily, merged across nodes
(:func:`heapq.merge`), so a caller that stops after ``k`` candidates pays for the nodes' first passing
starts and for what it consumed.

Units: times are timezone-aware ``datetime``; amounts are ``Decimal`` in the resource's unit (atoms count
1 each for quota).
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from operator import itemgetter

from app.placement.filters.lease import NODE_BINDING
from app.placement.model import NodeInventory, NodeSnapshot, PlacementRequest, PoolSnapshot
from app.placement.schedulable import ineligibility, lease_ineligibility
from app.placement.selectors import selector_matches
from app.placement.system_labels import unmet_label


@dataclass(frozen=True, slots=True)
class Held:
    """One holding: ``amount`` held over the half-open window ``[start, end)``."""

    start: datetime
    end: datetime
    amount: Decimal = Decimal(1)


@dataclass(frozen=True, slots=True)
class NodeHoldings:
    """What a node holds in the searched span: ``bookings`` (atom id -> its booked windows ``(start,
    end)``, half-open, best given in end order; plain pairs, as a pool may hold 100,000 of them) and
    ``scalars`` (resource -> its holdings)."""

    bookings: Mapping[str, Sequence[tuple[datetime, datetime]]] = field(default_factory=dict)
    scalars: Mapping[str, Sequence[Held]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QuotaRoom:
    """The tenant's quota in the pool for the charged resources that have a limit: ``limits`` and
    ``holdings`` per resource, ``wanted`` what the request charges (docs/quota.md)."""

    limits: Mapping[str, Decimal] = field(default_factory=dict)
    wanted: Mapping[str, Decimal] = field(default_factory=dict)
    holdings: Mapping[str, Sequence[Held]] = field(default_factory=dict)


def peak(holdings: Iterable[Held], start: datetime, end: datetime) -> Decimal:
    """The most ``holdings`` hold together at any instant of ``[start, end)``: the sum at ``start`` or at
    a holding's start inside the window (a sum only grows at a start)."""
    inside = [h for h in holdings if h.start < end and start < h.end]
    instants = {start, *(h.start for h in inside if h.start > start)}
    return max(
        (sum((h.amount for h in inside if h.start <= u < h.end), Decimal(0)) for u in instants),
        default=Decimal(0),
    )


def quota_holds(quota: QuotaRoom, start: datetime, end: datetime) -> bool:
    """Whether every limited resource stays within its limit at every instant of ``[start, end)`` with the
    request's charge added (the charge guard's rule, app/quota/charges.py)."""
    return all(
        peak(quota.holdings.get(r, ()), start, end) + quota.wanted.get(r, Decimal(0)) <= limit
        for r, limit in quota.limits.items()
    )


class _NodeJudge:
    """One node's necessary condition at a start (see the module's docstring), on its own holdings."""

    __slots__ = ("node_id", "atoms", "counts", "bookings", "scalars", "wanted", "rooms", "lease", "ends")

    def __init__(
        self,
        node_id: str,
        atoms: list[list[str]],
        counts: list[int],
        holdings: NodeHoldings,
        wanted: Mapping[str, Decimal],
        rooms: Mapping[str, Decimal],
        lease: bool,
    ) -> None:
        self.node_id = node_id
        self.atoms, self.counts, self.wanted, self.rooms, self.lease = atoms, counts, wanted, rooms, lease
        relevant = {a for group in atoms for a in group}
        # per atom, its booked windows sorted by end: the first ending after t decides whether it is free
        self.bookings: dict[str, tuple[list[datetime], list[datetime]]] = {}
        for atom_id, windows in holdings.bookings.items():
            if lease or atom_id in relevant:
                ordered = sorted(windows, key=itemgetter(1))  # linear when given in end order
                self.bookings[atom_id] = ([w[1] for w in ordered], [w[0] for w in ordered])
        self.scalars = {r: list(h) for r, h in holdings.scalars.items() if lease or r in wanted}
        self.ends = sorted(
            {e for ends, _ in self.bookings.values() for e in ends}
            | {h.end for held in self.scalars.values() for h in held}
        )

    def atom_free(self, atom_id: str, start: datetime, end: datetime) -> bool:
        """No booking of the atom overlaps ``[start, end)``. Bookings of one atom never overlap (the
        exclusion constraint), so ordered by end they are ordered by start too: only the first one that
        ends after ``start`` can overlap."""
        found = self.bookings.get(atom_id)
        if found is None:
            return True
        ends, starts = found
        i = bisect_right(ends, start)  # the first booking that ends after ``start``
        return i == len(starts) or starts[i] >= end

    def holds_at(self, start: datetime, end: datetime) -> bool:
        """The necessary condition for the window ``[start, end)``."""
        if self.lease:
            if any(not self.atom_free(a, start, end) for a in self.bookings):
                return False
            if any(h.start < end and start < h.end for held in self.scalars.values() for h in held):
                return False
        for group, count in zip(self.atoms, self.counts, strict=True):
            free = 0
            for atom_id in group:
                if self.atom_free(atom_id, start, end):
                    free += 1
                    if free >= count:
                        break
            if free < count:
                return False
        for resource, amount in self.wanted.items():
            if peak(self.scalars.get(resource, ()), start, end) + amount > self.rooms[resource]:
                return False
        return True

    def starts(self, first: datetime, last: datetime, duration: timedelta) -> Iterator[datetime]:
        """The node's own candidate starts in ``[first, last]`` (``first`` and its holdings' ends) at which
        the condition holds, in increasing order."""
        for t in (first, *(e for e in self.ends if first < e <= last)):
            if self.holds_at(t, t + duration):
                yield t


def _judge(
    node: NodeSnapshot,
    pool: PoolSnapshot,
    request: PlacementRequest,
    rooms: Mapping[str, Decimal],
    holdings: NodeHoldings,
) -> _NodeJudge | None:
    """The node's judge, or None when the node can hold the request at no start: not schedulable for the
    tenant now (a lease: the lease rule), a required label missing, too few matching atoms that are
    healthy and bookable now, or no row of a requested scalar."""
    lease = request.binding == NODE_BINDING
    rule = lease_ineligibility if lease else ineligibility
    if rule(node, pool, request.tenant_id) is not None:
        return None
    inventory: NodeInventory = node.inventory
    if unmet_label(request.node_labels.items(), inventory.labels, inventory.label_sources) is not None:
        return None
    if any(r not in rooms for r in request.resources):
        return None
    atoms: list[list[str]] = []
    for device in request.devices:
        group = [
            a.id
            for a in inventory.atoms
            if a.device_class == device.device_class
            and a.id not in node.state.unavailable
            and (device.selector is None or selector_matches(device.selector, a, inventory))
        ]
        if len(group) < device.count:
            return None
        atoms.append(group)
    counts = [d.count for d in request.devices]
    return _NodeJudge(node.id, atoms, counts, holdings, dict(request.resources), rooms, lease)


class EarliestSearch:
    """The candidate starts of one request in increasing order, over the nodes added so far
    (:meth:`add`); :func:`search` adds every node at once. The span of starts is ``[first, last]``,
    ``first`` being the requested start; ``members`` nodes are needed at one start (a gang's members,
    else 1).

    Nodes may be added while starts are taken (:meth:`next_start` with ``before``): a caller that knows a
    lower bound of every node not added yet (:func:`node_bound`) takes only the starts below it, so the
    nodes whose holdings cannot hold the request early are never read."""

    def __init__(self, request: PlacementRequest, quota: QuotaRoom, last: datetime) -> None:
        assert request.start is not None and request.end is not None
        self.request, self.quota, self.last = request, quota, last
        self.first, self.duration = request.start, request.end - request.start
        self.members = request.gang.members if request.gang is not None else 1
        self.pool = PoolSnapshot(id=request.pool_id)
        self.judges: list[_NodeJudge] = []
        # (start, source, stream): source 0 is a node's own start (its condition holds there), 1 a quota end
        self._heap: list[tuple[datetime, int, int]] = []
        self._streams: list[Iterator[datetime]] = []
        self._previous: datetime | None = None
        quota_ends = sorted(
            {h.end for held in quota.holdings.values() for h in held if self.first < h.end <= last}
        )
        self._push(iter(quota_ends), 1)

    def _push(self, stream: Iterator[datetime], source: int) -> None:
        first = next(stream, None)
        if first is not None:
            self._streams.append(stream)
            heapq.heappush(self._heap, (first, source, len(self._streams) - 1))

    def add(self, node: NodeSnapshot, rooms: Mapping[str, Decimal], holdings: NodeHoldings) -> None:
        """Judge ``node`` (static inventory and its state that is not a window; ``rooms``: resource ->
        ``floor(allocatable x ratio)``; ``holdings``: what it holds overlapping ``[first, last +
        duration)``) from now on."""
        judge = _judge(node, self.pool, self.request, rooms, holdings)
        if judge is not None:
            self.judges.append(judge)
            self._push(judge.starts(self.first, self.last, self.duration), 0)

    def next_start(self, before: datetime | None = None) -> datetime | None:
        """The next candidate start (below ``before`` when given), or None: a start at which the quota
        holds and at least ``members`` of the added nodes meet the necessary condition. The earliest start
        at which the request fits is one of them (the module's docstring)."""
        d = self.duration
        while self._heap:
            t, source, i = self._heap[0]
            if before is not None and t >= before:
                return None
            heapq.heappop(self._heap)
            following = next(self._streams[i], None)
            if following is not None:
                heapq.heappush(self._heap, (following, source, i))
            if self._previous is not None and t <= self._previous:
                continue  # taken already (a node's own start sorts before a quota end at a tie)
            self._previous = t
            if not quota_holds(self.quota, t, t + d):
                continue
            if (source == 0 and self.members == 1) or self.nodes_holding(t, self.members) >= self.members:
                return t
        return None

    def starts(self) -> Iterator[datetime]:
        """:meth:`next_start` until there is none."""
        while (t := self.next_start()) is not None:
            yield t

    def nodes_holding(self, start: datetime, enough: int) -> int:
        """How many nodes meet the necessary condition for ``[start, start + duration)``, counting up to
        ``enough``."""
        found = 0
        for judge in self.judges:
            if judge.holds_at(start, start + self.duration):
                found += 1
                if found >= enough:
                    break
        return found

    def why_none(self) -> str:
        """Why there is no candidate start (docs/lifecycle.md, "Earliest start")."""
        d = self.duration
        node_starts = sorted({t for j in self.judges for t in j.starts(self.first, self.last, d)})
        if len([j for j in self.judges if next(j.starts(self.first, self.last, d), None)]) < self.members:
            return no_nodes_reason(self.members, self.last)
        if not any(quota_holds(self.quota, t, t + d) for t in node_starts):
            return no_quota_reason(self.last)
        return no_start_reason(self.members, self.last)


@dataclass(frozen=True, slots=True)
class BusyAtFirst:
    """What holds a node at the requested start, per device class (all classes under ``""`` for a
    lease): how many atoms are booked across that instant, the first and the last of their ends."""

    atoms: int
    first_end: datetime
    last_end: datetime


def class_counts(node: NodeInventory) -> dict[str, int]:
    """How many atoms of each device class the node has (static: the I/O half memoizes it per
    inventory version)."""
    counts: dict[str, int] = {}
    for atom in node.atoms:
        counts[atom.device_class] = counts.get(atom.device_class, 0) + 1
    return counts


def node_bound(
    atoms_of: Mapping[str, int], request: PlacementRequest, busy: Mapping[str, BusyAtFirst]
) -> datetime | None:
    """A lower bound of the node's first candidate start, from its atoms per class (``atoms_of``,
    :func:`class_counts`) and what holds it at the requested start ``T0`` alone, or None when the node
    has too few atoms of a requested class to ever hold it. Before the first end of the atoms booked
    across ``T0`` no more atoms of their class are free than at ``T0`` (atoms free at ``T0`` may only
    get booked), so a class short at ``T0`` stays short until then; a lease waits for the last end (the
    node must hold nothing). Scalars and selectors are left out: the bound stays a lower bound."""
    assert request.start is not None
    bound = request.start
    if request.binding == NODE_BINDING:
        held = busy.get("")
        return max(bound, held.last_end) if held is not None else bound
    for device in request.devices:
        total = atoms_of.get(device.device_class, 0)
        if total < device.count:
            return None
        held = busy.get(device.device_class)
        if held is not None and total - held.atoms < device.count:
            bound = max(bound, held.first_end)
    return bound


def no_nodes_reason(members: int, last: datetime) -> str:
    """``earliest: no <n> node(s) can hold it at any start up to <last>``."""
    nodes = "node" if members == 1 else f"{members} nodes"
    return f"earliest: no {nodes} can hold it at any start up to {last.isoformat()}"


def no_quota_reason(last: datetime) -> str:
    """``earliest: the tenant's quota does not hold at any start up to <last> where a node could``."""
    return (
        f"earliest: the tenant's quota does not hold at any start up to {last.isoformat()} where a node could"
    )


def no_start_reason(members: int, last: datetime) -> str:
    """``earliest: no start up to <last> leaves room on <n> node(s) within the quota``."""
    nodes = "one node" if members == 1 else f"{members} nodes"
    return f"earliest: no start up to {last.isoformat()} leaves room on {nodes} within the quota"


def search(
    request: PlacementRequest,
    nodes: Iterable[NodeSnapshot],
    capacities: Mapping[str, Mapping[str, Decimal]],
    holdings: Mapping[str, NodeHoldings],
    quota: QuotaRoom,
    last: datetime,
) -> EarliestSearch:
    """The search for ``request`` (its ``start`` is ``T0``, ``end - start`` the window length) over
    ``nodes`` (static inventory and the state that is not a window: NoSchedule reasons, leasable,
    unavailable atoms; ``booked`` and ``resources`` are not read), ``capacities`` (node id -> resource ->
    ``floor(allocatable x ratio)``), ``holdings`` (node id -> what it holds, overlapping
    ``[T0, last + duration)``) and ``quota``; starts run from ``T0`` to ``last`` (the database clock plus
    ``BC_CAPACITY_MAX_LEAD``)."""
    found = EarliestSearch(request, quota, last)
    for node in nodes:
        found.add(node, capacities.get(node.id, {}), holdings.get(node.id, NodeHoldings()))
    return found
