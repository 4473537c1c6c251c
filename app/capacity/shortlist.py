"""The shortlist (seed 000, "The shortlist") and the one entry point that plans a request.

Loading every node of a large pool for each request is expensive. When a request has no selectors, no
gang and no plugin scorers, SQL first returns every schedulable node with enough free atoms and scalar
room, ranked by the part of the score that depends only on counts (binpack + spread, the same formula as
:func:`app.placement.scorers.count_score_many`), and the pipeline plans only the best
``K = max(shortlist_min, 8 x topN)`` of them.

Why the answer is the same as planning the whole pool. Every filter the SQL applies (schedulable for the
tenant, nodeLabels, scalar room, enough free atoms of each class, the replan's excluded nodes) is a filter
the pipeline applies with the same rule, so a node the SQL leaves out is one the pipeline rejects. The
pipeline may reject more (topology, plugin filters, a plugin picker), never fewer. A node outside the
shortlist scores at most ``U = count score of the best node outside + C``, where ``C`` is the most any
node of the pool could score through topology and numa given its static links and NUMA groups
(:func:`app.placement.bounds.pick_score_ceiling`; at most ``w_topology + w_numa``), as there are no
plugin scorers. So when the shortlist plan holds at least
``needed`` candidates and the ``needed``-th best total is above ``U``, no node outside could enter the top
``needed``: the top-``needed`` ranking (and so the seeded pick among topN) is the one the whole pool would
give; a tie at ``U`` is safe when the inside node's id is smaller, since ties break on node id and
the SQL orders equal count scores by id. Otherwise, and whenever the shortlist plan finds nothing (the
pending reason must describe the whole pool), the whole pool is planned. ``needed`` is topN for a
reservation and max(topN, 10) for a preview.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import aggregate_order_by as pg_aggregate_order_by
from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.metrics import PLAN_SECONDS, PLANS
from app.capacity.predicates import schedulable_sql_tolerating
from app.capacity.snapshot import (
    PoolCache,
    PoolHead,
    PoolInventory,
    read_node_states,
    read_pool_head,
    read_snapshot,
    window,
)
from app.db.tables import device_bookings, devices, node_labels, node_resources, nodes, pools
from app.placement.bounds import pick_score_ceiling
from app.placement.model import NodeSnapshot, PlacementRequest, Plan, PoolSnapshot, Rejections
from app.placement.options import DEFAULT_WEIGHTS, SchedulerOptions
from app.placement.pipeline import plan_placement
from app.placement.scorers import count_score_many

TIE_MARGIN = 1e-9  # float noise between SQL and Python arithmetic: never trust a bound closer than this
PlanPath = Literal["shortlist", "full"]


@dataclass(frozen=True, slots=True)
class PlanOutcome:
    """A plan (or rejections) for a request, the pool head it was made on, and how it was made."""

    head: PoolHead
    plan: Plan | Rejections
    path: PlanPath


def shortlist_applies(request: PlacementRequest, options: SchedulerOptions) -> bool:
    """The seed's condition: no selectors, no gang and no plugin scorers (and a device-binding request)."""
    return (
        not request.has_selectors
        and request.gang is None
        and request.binding != "node"
        and not any(getattr(p, "scorers", ()) for p in options.plugins)
    )


def shortlist_size(options: SchedulerOptions, shortlist_min: int) -> int:
    """K = max(shortlist_min (48), 8 x topN)."""
    return max(shortlist_min, 8 * options.top_n)


def _label_conditions(request: PlacementRequest) -> list[Any]:
    conditions = []
    for key, value in sorted(request.node_labels.items()):
        clause = [node_labels.c.node_id == nodes.c.id, node_labels.c.key == key]
        if value != "*":
            clause.append(node_labels.c.value == value)
        if key.startswith("bc.dev/"):
            clause.append(node_labels.c.source == "system")
        conditions.append(sa.exists().where(*clause))
    return conditions


def _scalar_conditions(request: PlacementRequest) -> list[Any]:
    # EXISTS (SELECT 1 FROM node_resources r WHERE r.node_id = n.id AND r.resource = :r
    #          AND r.allocated + :n <= floor(r.allocatable * r.ratio))
    return [
        sa.exists().where(
            node_resources.c.node_id == nodes.c.id,
            node_resources.c.resource == resource,
            node_resources.c.allocated + amount
            <= sa.func.floor(node_resources.c.allocatable * node_resources.c.ratio),
        )
        for resource, amount in sorted(request.resources.items())
    ]


async def shortlist_rows(
    conn: AsyncConnection, request: PlacementRequest, options: SchedulerOptions, limit: int
) -> list[tuple[str, float]]:
    """The best ``limit`` viable nodes as ``(node id, count score)``, best first, ties on node id.

    The SQL, for a request of devices ``req(class, cnt)`` in window ``w``::

        WITH booked AS (SELECT DISTINCT device_pk FROM device_bookings
                         WHERE pool_id = :pool AND during && :w),
             cls AS (SELECT d.node_id, r.class, r.cnt, count(*) AS total,
                            count(*) FILTER (WHERE d.healthy AND d.bookable AND b.device_pk IS NULL) AS free
                       FROM devices d JOIN nodes n ON n.id = d.node_id JOIN req r ON r.class = d.class
                       LEFT JOIN booked b ON b.device_pk = d.pk
                      WHERE n.pool_id = :pool GROUP BY d.node_id, r.class, r.cnt)
        SELECT n.id, array_agg(c.total ORDER BY c.class), array_agg(c.free ORDER BY c.class)
          FROM nodes n JOIN pools p ON p.id = n.pool_id JOIN cls c ON c.node_id = n.id
         WHERE n.pool_id = :pool AND <schedulable for tenant> AND n.id <> ALL(:excluded)
           AND <scalar room EXISTS ...> AND <nodeLabels EXISTS ...>
         GROUP BY n.id HAVING count(*) = :classes AND bool_and(c.free >= c.cnt)
         ORDER BY w_binpack * avg((total - free + cnt) / total) + w_spread * avg(free / total) DESC, n.id
         LIMIT :limit
    """
    assert request.start is not None and request.end is not None
    weights = {k: options.weight(k, v) for k, v in DEFAULT_WEIGHTS.items()}
    where = [
        nodes.c.pool_id == request.pool_id,
        schedulable_sql_tolerating(request.tenant_id),
        *_scalar_conditions(request),
        *_label_conditions(request),
    ]
    if options.excluded_nodes:
        where.append(nodes.c.id.notin_(sorted(options.excluded_nodes)))
    base = nodes.join(pools, pools.c.id == nodes.c.pool_id)
    if not request.devices:
        rows = (
            await conn.execute(
                sa.select(nodes.c.id).select_from(base).where(*where).order_by(nodes.c.id).limit(limit)
            )
        ).all()
        return [(r.id, 0.0) for r in rows]

    counts = sorted((d.device_class, d.count) for d in request.devices)
    req = sa.values(sa.column("class", sa.Text), sa.column("cnt", sa.Integer), name="req").data(counts)
    booked = (
        sa.select(device_bookings.c.device_pk)
        .where(
            device_bookings.c.pool_id == request.pool_id,
            device_bookings.c.during.op("&&")(window(request.start, request.end)),
        )
        .distinct()
        .subquery("booked")
    )
    free = sa.func.count().filter(
        sa.and_(devices.c.healthy, devices.c.bookable, booked.c.device_pk.is_(None))
    )
    cls = (
        sa.select(
            devices.c.node_id,
            req.c["class"].label("cls"),
            req.c.cnt,
            sa.func.count().label("total"),
            free.label("free"),
        )
        .select_from(
            devices.join(nodes, nodes.c.id == devices.c.node_id)
            .join(req, req.c["class"] == devices.c["class"])
            .outerjoin(booked, booked.c.device_pk == devices.c.pk)
        )
        .where(nodes.c.pool_id == request.pool_id)
        .group_by(devices.c.node_id, req.c["class"], req.c.cnt)
        .subquery("cls")
    )
    total = sa.cast(cls.c.total, sa.Float)
    binpack = sa.func.least(1.0, sa.cast(cls.c.total - cls.c.free + cls.c.cnt, sa.Float) / total)
    spread = sa.func.greatest(0.0, 1.0 - sa.cast(cls.c.total - cls.c.free, sa.Float) / total)
    score = weights["binpack"] * sa.func.avg(binpack) + weights["spread"] * sa.func.avg(spread)
    stmt = (
        sa.select(
            nodes.c.id,
            sa.func.array_agg(pg_aggregate_order_by(cls.c.total, cls.c.cls)).label("totals"),
            sa.func.array_agg(pg_aggregate_order_by(cls.c.free, cls.c.cls)).label("frees"),
        )
        .select_from(base.join(cls, cls.c.node_id == nodes.c.id))
        .where(*where)
        .group_by(nodes.c.id)
        .having(sa.and_(sa.func.count() == len(counts), sa.func.bool_and(cls.c.free >= cls.c.cnt)))
        .order_by(score.desc(), nodes.c.id)
        .limit(limit)
    )
    rows = (await conn.execute(stmt)).all()
    return [
        (
            r.id,
            count_score_many(
                [(t, t - f, cnt) for t, f, (_cls, cnt) in zip(r.totals, r.frees, counts, strict=True)],
                weights,
            ),
        )
        for r in rows
    ]


async def plan_request(
    conn: AsyncConnection,
    cache: PoolCache,
    request: PlacementRequest,
    options: SchedulerOptions,
    shortlist_min: int = 48,
    needed: int | None = None,
) -> PlanOutcome:
    """Plan ``request`` on plain reads: through the shortlist when it applies and is provably the same
    as the whole pool, else on the whole pool. ``needed`` (default topN) is how many of the best
    candidates must be exact. Raises NotFound when the pool does not exist."""
    assert request.start is not None and request.end is not None
    with PLAN_SECONDS.time():
        outcome = await _plan_request(conn, cache, request, options, shortlist_min, needed or options.top_n)
    PLANS.labels(outcome.path).inc()
    return outcome


async def _plan_request(
    conn: AsyncConnection,
    cache: PoolCache,
    request: PlacementRequest,
    options: SchedulerOptions,
    shortlist_min: int,
    needed: int,
) -> PlanOutcome:
    assert request.start is not None and request.end is not None
    if shortlist_applies(request, options):
        head = await read_pool_head(conn, request.pool_id)
        if not head.archived:
            k = shortlist_size(options, shortlist_min)
            rows = await shortlist_rows(conn, request, options, k + 1)
            if rows:
                inside = [node_id for node_id, _ in rows[:k]]
                inventory = await cache.inventory(conn, head)
                states = await read_node_states(conn, request.pool_id, request.start, request.end, inside)
                picked = set(inside)
                snapshot = PoolSnapshot(
                    id=request.pool_id,
                    archived=False,
                    nodes=tuple(
                        NodeSnapshot(inventory.nodes[node_id], states[node_id])
                        for node_id in inventory.order
                        if node_id in picked and node_id in states
                    ),
                )
                plan = plan_placement(request, snapshot, options)
                ceiling = _pick_ceiling(inventory, request, options)
                if isinstance(plan, Plan) and _provably_complete(plan, rows, k, needed, ceiling):
                    return PlanOutcome(head, plan, "shortlist")
    head, snapshot = await read_snapshot(conn, cache, request.pool_id, request.start, request.end)
    return PlanOutcome(head, plan_placement(request, snapshot, options), "full")


def _pick_ceiling(inventory: PoolInventory, request: PlacementRequest, options: SchedulerOptions) -> float:
    """The most any node of the pool could add through topology and numa (memoized per version)."""
    key = (
        "pick-ceiling",
        tuple((d.device_class, d.count) for d in request.devices),
        tuple(sorted(options.weights.items())),
    )
    found = inventory.memo.get(key)
    if found is None:
        found = inventory.memo[key] = pick_score_ceiling(
            inventory.nodes.values(), request.devices, options.weights
        )
    return found


def _provably_complete(
    plan: Plan, rows: list[tuple[str, float]], k: int, needed: int, ceiling: float
) -> bool:
    if len(rows) <= k:
        return True  # every viable node is in the shortlist
    bound = rows[k][1] + ceiling
    if len(plan.ranked) < needed:
        return False
    last = plan.ranked[needed - 1]
    if last.score > bound + TIE_MARGIN:
        return True
    # A tie at the bound: only an outside node with the best outside count score can reach it, and the
    # SQL orders equal count scores by node id, so rows[k] has the smallest id of those; ties in the
    # pipeline also break on node id, so the inside node keeps its place when its id is smaller.
    return abs(last.score - bound) <= TIE_MARGIN and last.node_id < rows[k][0]
