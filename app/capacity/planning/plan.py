"""Plan orchestration: the one entry point that plans a request (:func:`plan_request`), through the
shortlist (docs/architecture.md, "planning") when it applies.

Loading every node of a large pool for each request is expensive. When a request has no selectors, no
gang and no plugin scorers, the placer first finds every schedulable node with enough free atoms and
scalar room, ranked by the part of the score that depends only on counts (the ``COUNTS`` scorers,
the same formula as :meth:`app.placement.scorers.contract.ScorerSet.count_score_many`), and the
pipeline plans only the best ``K = max(shortlist_min, 8 x topN)`` of them.

How the shortlist is found without reading the pool. The static part (which atoms of which class each
node has, its labels, which scalar resources it has rows for) is in the pool cache. SQL then reads only
the exceptions for the window: bookings that overlap it, unhealthy or unbookable atoms (a partial
index), nodes with NoSchedule reasons (a partial index) judged by the commit's own predicate
``schedulable_sql_tolerating``, and nodes without room for a requested scalar. Every other node is free
and schedulable, so its count score depends only on its atom counts: alike nodes form one group with one
score, and a group contributes its first K nodes by id. The cost is the exceptions plus groups x K.

Why the answer is the same as planning the whole pool. Every filter the shortlist applies (schedulable
for the tenant, nodeLabels, scalar room, enough free atoms of each class, the replan's excluded nodes) is
a filter the pipeline applies with the same rule, so a node it leaves out is one the pipeline rejects. The
pipeline may reject more (topology, plugin filters, a plugin picker), never fewer. A node outside the
shortlist scores at most ``U = count score of the best node outside + C``, where ``C`` is the most any
node of the pool could score through the ``PICK`` scorers given its static links and NUMA groups
(:func:`app.placement.bounds.pick_score_ceiling`, derived from the scorers' declarations), as there are
no plugin scorers and no ``NODE`` scorers. So when the shortlist plan holds at least
``needed`` candidates and the ``needed``-th best total is above ``U``, no node outside could enter the top
``needed``: the top-``needed`` ranking (and so the seeded pick among topN) is the one the whole pool would
give; a tie at ``U`` is safe when the inside node's id is smaller, since ties break on node id and
the shortlist orders equal count scores by id. Otherwise, and whenever the shortlist plan finds nothing (the
pending reason must describe the whole pool), the whole pool is planned. ``needed`` is topN for a
reservation and max(topN, 10) for a preview.

When nothing on the shortlist fits, the whole pool is first planned on the exceptions already read
(path ``exceptions``): every node's NoSchedule reasons, unavailable and booked atoms are exactly what the
whole-pool read would find for the window, so only the requested scalar rows are read, pool-wide. A node
state built so differs from the whole-pool read's only in what no filter of this path reads (``leasable``,
read for node leases only; the scalar rows of resources not requested); plugin filters declare no reads,
so with plugins this step is skipped. When that plan finds nothing, its rejections are the whole pool's
(reason by reason); when it finds a fit (one the shortlist's ranking could not prove), the whole pool is
read and planned as before, so a placement is always ranked on the full read.

The ranking itself is pure (:mod:`app.placement.shortlist`); the narrow reads are in
:mod:`app.capacity.planning.exceptions`, and a batch's plans share them through
:mod:`app.capacity.planning.shared_reads`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.planning.exceptions import (
    INSIDE_SCALARS_READ,
    read_exceptions,
)
from app.capacity.planning.shared_reads import SharedReads, WindowGroup
from app.capacity.planning.snapshot import (
    PoolCache,
    PoolHead,
    read_pool_head,
    read_scalar_rows,
    read_snapshot,
)
from app.db.tables import node_resources, nodes, scalar_holdings
from app.observability.metrics import PLAN_DURATION, PLANS
from app.placement.gang import plan_gang
from app.placement.model import (
    NodeSnapshot,
    NodeState,
    PlacementRequest,
    Plan,
    PoolInventory,
    PoolSnapshot,
    Rejections,
    ScalarResource,
)
from app.placement.options import SchedulerOptions
from app.placement.pipeline import plan_placement
from app.placement.shortlist import (
    Exceptions,
    pick_ceiling,
    provably_complete,
    shortlist_applies,
    shortlist_rows,
    shortlist_size,
)
from app.placement.why_not import WhyNot, why_not

PlanPath = Literal["shortlist", "exceptions", "full"]


@dataclass(frozen=True, slots=True)
class PlanOutcome:
    """A plan (or rejections) for a request, the pool head it was made on, and how it was made."""

    head: PoolHead
    plan: Plan | Rejections
    path: PlanPath
    # the whole pool the rejections were made on (a plan that found nothing), for :meth:`why_not`
    snapshot: PoolSnapshot | None = None

    def why_not(self, request: PlacementRequest, options: SchedulerOptions) -> WhyNot | None:
        """The rejection rows and nearest misses of a plan that found nothing (docs/reasons.md); None
        when it found a plan, or the pool is archived."""
        if not isinstance(self.plan, Rejections) or self.snapshot is None or self.head.archived:
            return None
        return why_not(request, self.snapshot, self.plan, options)


async def plan_request(
    conn: AsyncConnection,
    cache: PoolCache,
    request: PlacementRequest,
    options: SchedulerOptions,
    shortlist_min: int = 48,
    needed: int | None = None,
    head: PoolHead | None = None,
    shared: SharedReads | None = None,
) -> PlanOutcome:
    """Plan ``request`` on plain reads: through the shortlist when it applies and is provably the same
    as the whole pool, else on the whole pool. ``needed`` (default topN) is how many of the best
    candidates must be exact; ``head``: the pool row when the caller read it in this transaction
    already (else it is read here); ``shared``: a batch's reads (:class:`SharedReads`: its head, one
    exceptions read per group, the batch's earlier plans). Raises NotFound when the pool does not
    exist."""
    assert request.start is not None and request.end is not None
    if shared is not None:
        head = head or shared.head
    with PLAN_DURATION.time():
        outcome = await _plan_request(
            conn, cache, request, options, shortlist_min, needed or options.top_n, head, shared
        )
    PLANS.labels(outcome.path).inc()
    return outcome


async def _plan_request(
    conn: AsyncConnection,
    cache: PoolCache,
    request: PlacementRequest,
    options: SchedulerOptions,
    shortlist_min: int,
    needed: int,
    head: PoolHead | None,
    shared: SharedReads | None,
) -> PlanOutcome:
    assert request.start is not None and request.end is not None
    if shortlist_applies(request, options):
        head = head or await read_pool_head(conn, request.pool_id)
        if not head.archived:
            k = shortlist_size(options, shortlist_min)
            inventory = await cache.inventory(conn, head)
            group: WindowGroup | None = None
            if shared is not None:
                group, exceptions = await shared.exceptions(conn, request)
            else:
                exceptions = await read_exceptions(
                    conn, request, cache.assumed(request.pool_id, request.start, request.end)
                )
            # a batch's group ranks 2K: the next K are read ahead with the first fetch they need
            rows = shortlist_rows(inventory, request, options, exceptions, 2 * k if group else k + 1, group)
            plan: Plan | Rejections | None = None
            if rows:
                inside = [node_id for node_id, _ in rows[:k]]
                states = await _inside_states(
                    conn, inside, request, exceptions, group, [n for n, _ in rows[k:]]
                )
                snapshot = PoolSnapshot(
                    id=request.pool_id,
                    archived=False,
                    nodes=tuple(
                        group.snapshot(inventory, node_id, state)
                        if group is not None
                        else NodeSnapshot(inventory.nodes[node_id], state)
                        for node_id, state in states.items()
                    ),
                )
                memo = group.node_memos if group is not None else None
                plan = plan_placement(request, snapshot, options, memo)
                ceiling = pick_ceiling(inventory, request, options)
                if isinstance(plan, Plan) and provably_complete(plan, rows, k, needed, ceiling):
                    return PlanOutcome(head, plan, "shortlist")
            if group is None and not options.plugins and not isinstance(plan, Plan):
                # nothing on the shortlist fits: the whole pool on the exceptions read (module docstring)
                whole = await _exceptions_snapshot(conn, inventory, request, exceptions)
                plan = plan_placement(request, whole, options)
                if isinstance(plan, Rejections):
                    return PlanOutcome(head, plan, "exceptions", whole)
    head, snapshot = await read_snapshot(conn, cache, request.pool_id, request.start, request.end, head=head)
    if shared is not None:
        snapshot = shared.overlay(snapshot, request)
    planner = plan_gang if request.gang is not None and request.gang.members > 1 else plan_placement
    plan = planner(request, snapshot, options)
    return PlanOutcome(head, plan, "full", snapshot if isinstance(plan, Rejections) else None)


async def _exceptions_snapshot(
    conn: AsyncConnection, inventory: PoolInventory, request: PlacementRequest, exceptions: Exceptions
) -> PoolSnapshot:
    """The whole pool for ``request``'s window on the ``exceptions`` already read, plus one read of the
    requested scalar rows of every node with the peak each holds over the window (module docstring)::

        SELECT nr.node_id, nr.resource, nr.allocatable, nr.ratio, coalesce(p.peak, 0)
          FROM node_resources nr JOIN nodes n ON n.id = nr.node_id
          LEFT JOIN (<peaks over the window of the pool's holdings of :names>) p USING (node_id, resource)
         WHERE n.pool_id = :pool AND nr.resource = ANY(:names)
    """
    assert request.start is not None and request.end is not None
    resources: dict[str, dict[str, ScalarResource]] = {}
    if request.resources:
        names = sorted(request.resources)
        resources = await read_scalar_rows(
            conn,
            [
                nodes.c.pool_id == request.pool_id,
                nodes.c.deleted_at.is_(None),
                node_resources.c.resource.in_(names),
            ],
            [scalar_holdings.c.pool_id == request.pool_id, scalar_holdings.c.resource.in_(names)],
            request.start,
            request.end,
            join_nodes=True,
        )
    free = NodeState()  # one state shared by every node with nothing to say
    states: list[NodeSnapshot] = []
    for node_id in inventory.order:
        reasons = exceptions.reasons.get(node_id, ())
        unavailable = exceptions.unavailable.get(node_id)
        booked = exceptions.booked.get(node_id)
        rows = resources.get(node_id)
        state = free
        if reasons or unavailable or booked or rows:
            state = NodeState(
                no_schedule_reasons=reasons,
                unavailable=frozenset(unavailable or ()),
                booked=frozenset(booked or ()),
                resources=rows or {},
            )
        states.append(NodeSnapshot(inventory.nodes[node_id], state))
    return PoolSnapshot(id=request.pool_id, archived=False, nodes=tuple(states))


async def _inside_states(
    conn: AsyncConnection,
    inside: list[str],
    request: PlacementRequest,
    exceptions: Exceptions,
    group: WindowGroup | None = None,
    ahead: Iterable[str] = (),
) -> dict[str, NodeState]:
    """The volatile state of the shortlisted nodes, in ranking order: the exceptions already read plus
    their rows of the requested scalar resources, each with the peak held over the window
    (:data:`INSIDE_SCALARS`: a sweep over these nodes' holdings only; the shortlist path has no gang and
    no node lease, so the pipeline reads no others). With a batch's ``group`` the rows come from (and
    are added to) the group's, with the batch's own amounts added."""
    resources: dict[str, dict[str, ScalarResource]] = {}
    if group is not None:
        if request.resources:
            await group.fetch(conn, inside, ahead)
            group.catch_up()  # exceptions.booked is the group's: it sees them
        return {node_id: group.state(node_id) for node_id in inside}
    if request.resources:
        assert request.start is not None and request.end is not None
        params = {
            "inside": inside,
            "names": sorted(request.resources),
            "starts_at": request.start,
            "ends_at": request.end,
        }
        for r in (await INSIDE_SCALARS_READ.run(conn, params)).all():
            resources.setdefault(r.node_id, {})[r.resource] = ScalarResource(r.allocatable, r.ratio, r.held)
    return {
        node_id: NodeState(
            no_schedule_reasons=exceptions.reasons.get(node_id, ()),
            unavailable=frozenset(exceptions.unavailable.get(node_id, ())),
            booked=frozenset(exceptions.booked.get(node_id, ())),
            resources=resources.get(node_id, {}),
        )
        for node_id in inside
    }
