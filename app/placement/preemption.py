"""Spot preemption's victim choice (docs/preemption.md; docs/lifecycle.md): pure, like
the rest of the pipeline. Data in (the pool snapshot, the placed spot work overlapping the request's
window, the scalar holdings of the nodes that hold spot work, ``now``), data out (a
:class:`PreemptionPlan`, or None when preempting spot work would not make the request fit).

The rule: a regular (``spot: false``) request that does not fit may take what spot reservations hold in
its window; spot never preempts spot, and a regular reservation is never a victim.

How it is decided:

1. The *relaxed* snapshot counts every overlapping spot holding as free: a node's booked atoms lose the
   spot reservations' atoms, and its scalars' ``allocated`` is the peak over the window of the other
   holdings only (an exact sweep, :func:`peak_held`). The normal pipeline (or the gang planner) plans
   the request on it; its candidates are the nodes where preemption can make the request fit.
2. On each such node, the victims are the smallest set of that node's spot reservations whose eviction
   leaves the node fitting (every filter, the atom pick and topology of the normal pipeline, run on that
   one node). Among sets of one size: least GPU-time lost (atoms x remaining seconds, summed over the
   victims' whole reservations), then the newest victims (creation instants, newest first), then ids.
   Sets of up to :data:`EXHAUSTIVE_LIMIT` reservations per node are searched exhaustively (a quick
   count of freed atoms prunes sets that cannot hold the request); beyond that a greedy pass adds the
   cheapest victims until the node fits and then drops any that are not needed.
   Sizes below a lower bound (the fewest reservations whose atoms could cover the deficit of each
   requested class) are skipped, and nodes are searched in that bound's order: once it exceeds the
   best node's victims, no later node can rank first.
3. The node: fewest victims, then least GPU-time lost, then the newest victims, then the normal
   scorers' total (higher first), then the node id. There is no random pick: the preview of the same
   body on the same state names the node a reserve takes.
4. A gang keeps the gang planner's members on the relaxed snapshot and evicts on each member's node;
   every member's victims are evicted together or none are (the commit is one savepoint).

Units: amounts are ``Decimal`` in the resource's unit; GPU-time lost is atom-seconds (float).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from itertools import combinations

from app.placement.gang import plan_gang
from app.placement.model import (
    Candidate,
    NodeSnapshot,
    PlacementRequest,
    Plan,
    PoolSnapshot,
    ScalarResource,
)
from app.placement.options import SchedulerOptions
from app.placement.pipeline import plan_placement

EXHAUSTIVE_LIMIT = 10  # spot reservations on one node searched exhaustively (2^10 sets at most)


@dataclass(frozen=True, slots=True)
class SpotWork:
    """A placed spot reservation whose window overlaps the request's: ``atoms`` and ``resources`` by
    node id (what it books and holds there), its window ``[start, end)`` and creation instant."""

    reservation_id: str
    tenant_id: str
    created_at: datetime
    start: datetime
    end: datetime
    atoms: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def lost_seconds(self, now: datetime) -> float:
        """GPU-time lost when it is evicted at ``now``: its atoms x the seconds of its window left."""
        left = (self.end - max(now, self.start)).total_seconds()
        return max(left, 0.0) * sum(len(a) for a in self.atoms.values())


@dataclass(frozen=True, slots=True)
class ScalarHold:
    """One scalar holding overlapping the window on a node that holds spot work: ``spot_reservation`` is
    the id of the spot reservation holding it, or None for any other holder (never evicted)."""

    node_id: str
    resource: str
    amount: Decimal
    start: datetime
    end: datetime
    spot_reservation: str | None = None


@dataclass(frozen=True, slots=True)
class Eviction:
    """The victims on one node and the candidate the request takes there once they are gone."""

    candidate: Candidate
    victims: tuple[str, ...]  # reservation ids, sorted
    lost_seconds: float
    newest: tuple[float, ...]  # the victims' creation instants (POSIX seconds), negated, ascending


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    """What to commit: ``placements`` (the candidate, or a gang's members) and the victim reservations
    (every member's, each once, sorted by id), with ``evictions`` per placement in its order."""

    placements: tuple[Candidate, ...]
    evictions: tuple[Eviction, ...]
    victims: tuple[SpotWork, ...]


def peak_held(holds: Iterable[ScalarHold], start: datetime, end: datetime) -> Decimal:
    """The most ``holds`` hold at any instant of ``[start, end)`` (half-open windows: a holding ending at
    an instant is not held together with one starting there; ends sort before starts)."""
    events: list[tuple[datetime, Decimal]] = []
    for h in holds:
        if h.end <= start or h.start >= end:
            continue
        events.append((max(h.start, start), h.amount))
        if h.end < end:
            events.append((h.end, -h.amount))
    events.sort()
    held = peak = Decimal(0)
    for _at, delta in events:
        held += delta
        peak = max(peak, held)
    return peak


def _freed_node(
    node: NodeSnapshot,
    victims: Sequence[SpotWork],
    holds: Sequence[ScalarHold],
    start: datetime,
    end: datetime,
) -> NodeSnapshot:
    """``node`` with what ``victims`` hold there counted as free (atoms and scalar peaks)."""
    gone = {v.reservation_id for v in victims}
    freed_atoms = frozenset().union(*(v.atoms.get(node.id, frozenset()) for v in victims))
    resources = dict(node.state.resources)
    for name, resource in node.state.resources.items():
        kept = [h for h in holds if h.resource == name and h.spot_reservation not in gone]
        if any(h.resource == name for h in holds):
            resources[name] = ScalarResource(
                resource.allocatable, resource.ratio, peak_held(kept, start, end)
            )
    state = replace(node.state, booked=node.state.booked - freed_atoms, resources=resources)
    return NodeSnapshot(node.inventory, state)


def _work_by_node(spot: Sequence[SpotWork]) -> dict[str, list[SpotWork]]:
    out: dict[str, list[SpotWork]] = {}
    for work in sorted(spot, key=lambda w: w.reservation_id):
        for node_id in work.atoms:
            out.setdefault(node_id, []).append(work)
    return out


def _holds_by_node(holds: Sequence[ScalarHold]) -> dict[str, list[ScalarHold]]:
    out: dict[str, list[ScalarHold]] = {}
    for h in holds:
        out.setdefault(h.node_id, []).append(h)
    return out


@dataclass(frozen=True, slots=True)
class _NodeSearch:
    """Everything the victim search on one node needs."""

    request: PlacementRequest  # one member (no gang)
    node: NodeSnapshot
    works: tuple[SpotWork, ...]
    holds: tuple[ScalarHold, ...]
    options: SchedulerOptions
    now: datetime
    pool_id: str

    def fit(self, victims: Sequence[SpotWork]) -> Candidate | None:
        """The candidate on the node once ``victims`` are gone, or None when it still does not fit."""
        assert self.request.start is not None and self.request.end is not None
        freed = _freed_node(self.node, victims, self.holds, self.request.start, self.request.end)
        plan = plan_placement(self.request, PoolSnapshot(id=self.pool_id, nodes=(freed,)), self.options)
        return plan.chosen if isinstance(plan, Plan) else None

    def lower_bound(self) -> int:
        """The fewest victims that could free enough atoms of every requested class (a lease: every
        spot reservation of the node); no set smaller than this can fit."""
        if self.request.binding == "node":
            return len(self.works)
        state, node_id = self.node.state, self.node.id
        busy = state.booked | state.unavailable
        needed = 0
        for d in self.request.devices:
            of_class = {a.id for a in self.node.inventory.atoms if a.device_class == d.device_class}
            deficit = d.count - len(of_class - busy)
            gains = sorted(
                (len(w.atoms.get(node_id, frozenset()) & of_class) for w in self.works), reverse=True
            )
            taken = 0
            while deficit > 0 and taken < len(gains) and gains[taken] > 0:
                deficit -= gains[taken]
                taken += 1
            needed = max(needed, taken if deficit <= 0 else len(self.works) + 1)
        return needed

    def enough_atoms(self, victims: Sequence[SpotWork]) -> bool:
        """A cheap necessary condition: the freed atoms plus the free ones cover every class's count."""
        if self.request.binding == "node":
            return True
        state = self.node.state
        freed = frozenset().union(*(v.atoms.get(self.node.id, frozenset()) for v in victims))
        busy = (state.booked - freed) | state.unavailable
        for d in self.request.devices:
            free = sum(
                1 for a in self.node.inventory.atoms if a.device_class == d.device_class and a.id not in busy
            )
            if free < d.count:
                return False
        return True

    def eviction(self, victims: Sequence[SpotWork], candidate: Candidate) -> Eviction:
        ordered = sorted(victims, key=lambda v: v.reservation_id)
        return Eviction(
            candidate=candidate,
            victims=tuple(v.reservation_id for v in ordered),
            lost_seconds=sum(v.lost_seconds(self.now) for v in ordered),
            newest=tuple(sorted(-v.created_at.timestamp() for v in ordered)),
        )


def _set_key(
    search: _NodeSearch, victims: Sequence[SpotWork]
) -> tuple[float, tuple[float, ...], tuple[str, ...]]:
    """Within one size: least GPU-time lost, then the newest victims, then ids."""
    return (
        sum(v.lost_seconds(search.now) for v in victims),
        tuple(sorted(-v.created_at.timestamp() for v in victims)),
        tuple(sorted(v.reservation_id for v in victims)),
    )


def _exhaustive(search: _NodeSearch) -> Eviction | None:
    for size in range(search.lower_bound(), len(search.works) + 1):
        sets = sorted(
            (c for c in combinations(search.works, size) if search.enough_atoms(c)),
            key=lambda c: _set_key(search, c),
        )
        for victims in sets:  # best first: the first that fits is the answer for this size
            candidate = search.fit(victims)
            if candidate is not None:
                return search.eviction(victims, candidate)
    return None


def _greedy(search: _NodeSearch) -> Eviction | None:
    order = sorted(search.works, key=lambda w: _set_key(search, (w,)))
    chosen: list[SpotWork] = []
    for work in order:
        chosen.append(work)
        if search.enough_atoms(chosen) and search.fit(chosen) is not None:
            break
    else:
        return None
    for work in reversed(list(chosen)):  # drop the costliest ones that are not needed
        rest = [w for w in chosen if w is not work]
        if search.enough_atoms(rest) and search.fit(rest) is not None:
            chosen = rest
    candidate = search.fit(chosen)
    assert candidate is not None
    return search.eviction(chosen, candidate)


def node_eviction(
    request: PlacementRequest,
    node: NodeSnapshot,
    works: Sequence[SpotWork],
    holds: Sequence[ScalarHold],
    options: SchedulerOptions,
    now: datetime,
    pool_id: str = "",
) -> Eviction | None:
    """The smallest set of ``works`` (spot reservations on ``node``) whose eviction makes ``request``
    (one member) fit on ``node``, with the candidate it then takes; None when even all of them do not."""
    search = _NodeSearch(request, node, tuple(works), tuple(holds), options, now, pool_id)
    if search.lower_bound() > len(works):
        return None
    return _exhaustive(search) if len(works) <= EXHAUSTIVE_LIMIT else _greedy(search)


def _node_key(e: Eviction) -> tuple[int, float, tuple[float, ...], float, str]:
    return (len(e.victims), e.lost_seconds, e.newest, -e.candidate.score, e.candidate.node_id)


def plan_preemption(
    request: PlacementRequest,
    snapshot: PoolSnapshot,
    spot: Sequence[SpotWork],
    holds: Sequence[ScalarHold],
    options: SchedulerOptions,
    now: datetime,
) -> PreemptionPlan | None:
    """Plan ``request`` (regular) by evicting spot work; None for a spot request, or when evicting every
    overlapping spot reservation would still not make it fit (see the module docstring for the order).

    ``spot``: the placed spot reservations overlapping the request's window; ``holds``: every scalar
    holding of a requested resource overlapping the window on the nodes that hold spot work;
    ``now``: the instant of the eviction (GPU-time lost counts from it)."""
    if request.spot or not spot:
        return None
    assert request.start is not None and request.end is not None
    by_node = _work_by_node(spot)
    holds_of = _holds_by_node(holds)
    relaxed = PoolSnapshot(
        id=snapshot.id,
        archived=snapshot.archived,
        nodes=tuple(
            _freed_node(n, by_node[n.id], holds_of.get(n.id, []), request.start, request.end)
            if n.id in by_node
            else n
            for n in snapshot.nodes
        ),
    )
    gang = request.gang is not None and request.gang.members > 1
    relaxed_plan = (plan_gang if gang else plan_placement)(request, relaxed, options)
    if not isinstance(relaxed_plan, Plan):
        return None
    member = replace(request, gang=None)
    nodes = {n.id: n for n in snapshot.nodes}

    def search_on(node_id: str) -> _NodeSearch:
        works = tuple(by_node.get(node_id, []))
        return _NodeSearch(
            member, nodes[node_id], works, tuple(holds_of.get(node_id, [])), options, now, snapshot.id
        )

    def evict_on(node_id: str) -> Eviction | None:
        s = search_on(node_id)
        return node_eviction(member, s.node, s.works, s.holds, options, now, snapshot.id)

    if gang:
        evictions: list[Eviction] = []
        for m in relaxed_plan.members:
            found = evict_on(m.node_id)
            if found is None:
                return None  # all members or none
            evictions.append(found)
    else:
        # nodes by the fewest victims they could need: once that bound exceeds the best node's victims,
        # no later node can rank first (fewest victims leads the order)
        bounded = sorted((search_on(c.node_id).lower_bound(), c.node_id) for c in relaxed_plan.ranked)
        best: Eviction | None = None
        for bound, node_id in bounded:
            if best is not None and bound > len(best.victims):
                break
            found = evict_on(node_id)
            if found is not None and (best is None or _node_key(found) < _node_key(best)):
                best = found
        if best is None:
            return None
        evictions = [best]
    works = {w.reservation_id: w for w in spot}
    victim_ids = sorted({v for e in evictions for v in e.victims})
    return PreemptionPlan(
        placements=tuple(e.candidate for e in evictions),
        evictions=tuple(evictions),
        victims=tuple(works[v] for v in victim_ids),
    )
