"""The shortlist (seed 000, "The shortlist") and the one entry point that plans a request.

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

A batch (:mod:`app.capacity.placing.batch`) plans its entries on reads they share (:class:`SharedReads`): one
exceptions read per (window, resource names, tenant) group, the batch's earlier plans counted in, the
touched nodes' scores, the inside nodes' states and the pipeline's per-node outcomes memoized until a
plan or an assumption changes the node (the outcomes under keys the pipeline derives from what its
filters and scorers declare they read, docs/extending.md, "What a filter reads"). The guarded commit
still decides, as for a plan of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal
from functools import cache
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.planning.snapshot import (
    PoolCache,
    PoolHead,
    read_pool_head,
    read_snapshot,
    scalar_peaks,
)
from app.capacity.predicates import schedulable_sql_within, tolerated_reasons
from app.db.prepared import Prepared
from app.db.tables import TS, device_bookings, devices, node_resources, nodes, pools, scalar_holdings
from app.db.windows import overlapping, window
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
from app.placement.pipeline import NodeMemos, plan_placement
from app.placement.scalar_capacity import scalar_capacity
from app.placement.shortlist import (
    Exceptions,
    pick_ceiling,
    provably_complete,
    shortlist_applies,
    shortlist_rows,
    shortlist_size,
)

PlanPath = Literal["shortlist", "full"]


@dataclass(frozen=True, slots=True)
class PlanOutcome:
    """A plan (or rejections) for a request, the pool head it was made on, and how it was made."""

    head: PoolHead
    plan: Plan | Rejections
    path: PlanPath


_POOL = sa.bindparam("pool_id", type_=sa.Text)
_NAMES = sa.bindparam("names", type_=pg.ARRAY(sa.Text))
_WINDOW = (sa.bindparam("starts_at", type_=TS), sa.bindparam("ends_at", type_=TS))
_MOST = sa.bindparam("most", type_=sa.Numeric)
_CAP = sa.func.floor(node_resources.c.allocatable * node_resources.c.ratio).label("cap")
# what each node holds of each requested resource over the window, summed (no sort): at least the peak
_TOTALS = (
    sa.select(
        scalar_holdings.c.node_id,
        scalar_holdings.c.resource,
        sa.func.sum(scalar_holdings.c.amount).label("total"),
    )
    .where(
        scalar_holdings.c.pool_id == _POOL,
        scalar_holdings.c.resource == sa.any_(_NAMES),
        *overlapping(scalar_holdings, *_WINDOW),
    )
    .group_by(scalar_holdings.c.node_id, scalar_holdings.c.resource)
    .subquery("totals")
)
# the nodes and resources whose holdings over the window sum to more than leaves room for :most
_TIGHT = (
    sa.select(_TOTALS.c.node_id, _TOTALS.c.resource)
    .join(
        node_resources,
        sa.and_(
            node_resources.c.node_id == _TOTALS.c.node_id, node_resources.c.resource == _TOTALS.c.resource
        ),
    )
    .where(_TOTALS.c.total + _MOST > _CAP)
    .cte("tight")
)
_TIGHT_PEAKS = scalar_peaks(
    [
        scalar_holdings.c.pool_id == _POOL,
        sa.tuple_(scalar_holdings.c.node_id, scalar_holdings.c.resource).in_(sa.select(_TIGHT)),
    ],
    *_WINDOW,
)
# the scalar exceptions of a window, built once (bind parameters only):
#   WITH tight AS (SELECT t.node_id, t.resource
#                    FROM (SELECT node_id, resource, sum(amount) AS total FROM scalar_holdings
#                           WHERE pool_id = :pool_id AND resource = ANY(:names) AND <overlapping the window>
#                           GROUP BY 1, 2) t                            -- a plain sum, at least the peak
#                    JOIN node_resources r USING (node_id, resource)
#                   WHERE t.total + :most > floor(r.allocatable * r.ratio))  -- the sum leaves no room
#   SELECT r.node_id, r.resource, NULL AS peak, floor(r.allocatable * r.ratio) AS cap
#     FROM node_resources r JOIN nodes n ON n.id = r.node_id
#    WHERE n.pool_id = :pool_id AND r.resource = ANY(:names) AND floor(...) < :most  -- small ones
#   UNION ALL
#   SELECT p.node_id, p.resource, p.peak, floor(r.allocatable * r.ratio)
#     FROM (<peak per node and resource over [:starts_at, :ends_at) of the holdings whose
#            (node_id, resource) IN (SELECT * FROM tight)>) p                  -- only those are swept
#     JOIN node_resources r USING (node_id, resource)
SCALAR_EXCEPTIONS = sa.union_all(
    sa.select(node_resources.c.node_id, node_resources.c.resource, sa.null().label("peak"), _CAP)
    .join(nodes, nodes.c.id == node_resources.c.node_id)
    .where(
        nodes.c.pool_id == _POOL,
        node_resources.c.resource == sa.any_(_NAMES),
        _CAP < _MOST,
    ),
    sa.select(_TIGHT_PEAKS.c.node_id, _TIGHT_PEAKS.c.resource, _TIGHT_PEAKS.c.peak, _CAP).join(
        node_resources,
        sa.and_(
            node_resources.c.node_id == _TIGHT_PEAKS.c.node_id,
            node_resources.c.resource == _TIGHT_PEAKS.c.resource,
        ),
    ),
)
_INSIDE = sa.bindparam("inside", type_=pg.ARRAY(sa.Text))
_INSIDE_PEAKS = scalar_peaks(
    [scalar_holdings.c.node_id == sa.any_(_INSIDE), scalar_holdings.c.resource == sa.any_(_NAMES)], *_WINDOW
)
# the shortlisted nodes' rows of the requested resources with their peaks, built once:
#   SELECT r.node_id, r.resource, r.allocatable, r.ratio, coalesce(p.peak, 0) AS held
#     FROM node_resources r
#     LEFT JOIN (<peak per node and resource over the window, holdings of the :inside nodes only>) p
#       USING (node_id, resource)
#    WHERE r.node_id = ANY(:inside) AND r.resource = ANY(:names)
INSIDE_SCALARS = (
    sa.select(
        node_resources.c.node_id,
        node_resources.c.resource,
        node_resources.c.allocatable,
        node_resources.c.ratio,
        sa.func.coalesce(_INSIDE_PEAKS.c.peak, 0).label("held"),
    )
    .select_from(
        node_resources.outerjoin(
            _INSIDE_PEAKS,
            sa.and_(
                _INSIDE_PEAKS.c.node_id == node_resources.c.node_id,
                _INSIDE_PEAKS.c.resource == node_resources.c.resource,
            ),
        )
    )
    .where(node_resources.c.node_id == sa.any_(_INSIDE), node_resources.c.resource == sa.any_(_NAMES))
)
_INSIDE_SCALARS = Prepared(INSIDE_SCALARS)


_DURING = sa.bindparam("during", type_=device_bookings.c.during.type)
_TOLERATED = sa.bindparam("tolerated", type_=pg.ARRAY(sa.Text))  # predicates.tolerated_reasons(tenant)


def _atoms(column: Any) -> Any:
    """``array_agg(column)`` as ``text[]``."""
    return sa.func.array_agg(column, type_=pg.ARRAY(sa.Text))


@cache
def exceptions_statement(with_scalars: bool) -> Prepared:
    """The parts of :func:`read_exceptions` as one ``UNION ALL`` of rows ``(kind, node_id, atoms,
    reasons, ok, resource, peak, cap)``: ``b`` booked and ``u`` unavailable atoms (one row per node, its
    atoms aggregated: a pool's window can hold thousands of bookings), ``r`` nodes with
    NoSchedule reasons, ``s`` the scalar exceptions (``with_scalars``: a request with resources). Built
    and compiled once per variant from bind parameters only (``pool_id``, ``during``, ``tolerated`` and,
    with scalars, ``names``, ``most``, ``starts_at``, ``ends_at``: :func:`exceptions_params`) and run
    prepared (:class:`app.db.prepared.Prepared`)."""
    pad = {
        "atoms": sa.cast(sa.null(), pg.ARRAY(sa.Text)).label("atoms"),
        "reasons": sa.cast(sa.null(), pg.ARRAY(sa.Text)).label("reasons"),
        "ok": sa.cast(sa.null(), sa.Boolean).label("ok"),
        "resource": sa.cast(sa.null(), sa.Text).label("resource"),
        "peak": sa.cast(sa.null(), sa.Numeric).label("peak"),
        "cap": sa.cast(sa.null(), sa.Numeric).label("cap"),
    }

    def row(kind: str, node_id: Any, **given: Any) -> list[Any]:
        return [sa.literal(kind).label("kind"), node_id.label("node_id")] + [
            given[k].label(k) if k in given else v for k, v in pad.items()
        ]

    parts: list[Any] = [
        sa.select(*row("b", devices.c.node_id, atoms=_atoms(device_bookings.c.device_id)))
        .join(devices, devices.c.pk == device_bookings.c.device_pk)
        .where(device_bookings.c.pool_id == _POOL, device_bookings.c.during.op("&&")(_DURING))
        .group_by(devices.c.node_id),
        sa.select(*row("u", devices.c.node_id, atoms=_atoms(devices.c.id)))
        .join(nodes, nodes.c.id == devices.c.node_id)
        .where(nodes.c.pool_id == _POOL, sa.not_(sa.and_(devices.c.healthy, devices.c.bookable)))
        .group_by(devices.c.node_id),
        sa.select(
            *row(
                "r",
                nodes.c.id,
                reasons=nodes.c.no_schedule_reasons,
                ok=schedulable_sql_within(sa.cast(_TOLERATED, pg.ARRAY(sa.Text))),
            )
        )
        .select_from(nodes.join(pools, pools.c.id == nodes.c.pool_id))
        .where(nodes.c.pool_id == _POOL, nodes.c.no_schedule_reasons != sa.text("'{}'::text[]")),
    ]
    if with_scalars:
        scalars = SCALAR_EXCEPTIONS.subquery("scalars")
        parts.append(
            sa.select(
                *row(
                    "s",
                    scalars.c.node_id,
                    resource=scalars.c.resource,
                    peak=scalars.c.peak,
                    cap=scalars.c.cap,
                )
            )
        )
    return Prepared(sa.union_all(*parts))


def exceptions_params(request: PlacementRequest) -> dict[str, Any]:
    """The bind parameters of :func:`exceptions_statement` for ``request``'s pool, window, tenant and
    requested resources."""
    assert request.start is not None and request.end is not None
    params: dict[str, Any] = {
        "pool_id": request.pool_id,
        "during": window(request.start, request.end),
        "tolerated": tolerated_reasons(request.tenant_id),
    }
    if request.resources:
        params.update(
            names=sorted(request.resources),
            most=max(request.resources.values()),
            starts_at=request.start,
            ends_at=request.end,
        )
    return params


async def read_exceptions(
    conn: AsyncConnection, request: PlacementRequest, assumed: Mapping[str, set[str]] | None = None
) -> Exceptions:
    """The narrow volatile reads of a shortlist, in one round trip (:func:`exceptions_statement`):
    each part touches only the rows that differ from "free".

    ::

        SELECT d.node_id, array_agg(b.device_id) FROM device_bookings b JOIN devices d ON d.pk = b.device_pk
         WHERE b.pool_id = :pool AND b.during && :w GROUP BY d.node_id;       -- booked in the window
        SELECT d.node_id, array_agg(d.id) FROM devices d JOIN nodes n ON n.id = d.node_id
         WHERE n.pool_id = :pool AND NOT (d.healthy AND d.bookable) GROUP BY d.node_id;  -- partial index
        SELECT n.id, n.no_schedule_reasons, <schedulable for tenant> FROM nodes n JOIN pools p ON ...
         WHERE n.pool_id = :pool AND n.no_schedule_reasons <> '{}';           -- partial index
        <SCALAR_EXCEPTIONS>: the nodes whose room for a requested scalar may be short: too small
          even when free, or holding so much of it over the window that the sum of those holdings
          leaves no room (with the peak there; only these nodes are swept)
    """
    assert request.start is not None and request.end is not None
    read = await _read_exceptions(conn, exceptions_params(request), bool(request.resources))
    short, peaks = read.scalar_short(request.resources)
    booked = read.booked
    for node_id, atoms in (assumed or {}).items():  # other plans of this process are committing these
        booked.setdefault(node_id, set()).update(atoms)
    return Exceptions(booked, read.unavailable, read.reasons, read.unschedulable, frozenset(short), peaks)


@dataclass(frozen=True, slots=True)
class _ExceptionRows:
    """What one :func:`exceptions_statement` read returned, before a request's amounts judge the
    scalar rows: ``scalars`` are ``(node id, resource, peak or None, cap)``."""

    booked: dict[str, set[str]]
    unavailable: dict[str, set[str]]
    reasons: dict[str, tuple[str, ...]]
    unschedulable: frozenset[str]
    scalars: list[tuple[str, str, Decimal | None, Decimal]]

    def scalar_short(self, wanted: Mapping[str, Decimal]) -> tuple[set[str], dict[str, dict[str, Decimal]]]:
        """The nodes without room for ``wanted`` (resource -> amount) over the window, and the peaks
        read (node id -> resource -> peak). Rows of resources ``wanted`` lacks are ignored; a read made
        for a larger ``most`` holds every row a smaller one would (and its extra rows judge as roomy)."""
        short: set[str] = set()
        peaks: dict[str, dict[str, Decimal]] = {}
        for node_id, resource, peak, cap in self.scalars:
            n = wanted.get(resource)
            if n is None:
                continue
            if peak is not None:
                peaks.setdefault(node_id, {})[resource] = peak
            if (Decimal(0) if peak is None else peak) + Decimal(n) > cap:
                short.add(node_id)
        return short, peaks


async def _read_exceptions(
    conn: AsyncConnection, params: Mapping[str, Any], with_scalars: bool
) -> _ExceptionRows:
    booked: dict[str, set[str]] = {}
    unavailable: dict[str, set[str]] = {}
    reasons: dict[str, tuple[str, ...]] = {}
    unschedulable: set[str] = set()
    scalars: list[tuple[str, str, Decimal | None, Decimal]] = []
    # every part in one round trip: (kind, node id, atoms, reasons, ok, resource, peak, cap) rows
    for kind, node_id, atoms, node_reasons, ok, resource, peak, cap in (
        await exceptions_statement(with_scalars).run(conn, params)
    ).all():
        if kind == "b":
            booked[node_id] = set(atoms)
        elif kind == "u":
            unavailable[node_id] = set(atoms)
        elif kind == "r":
            reasons[node_id] = tuple(node_reasons)
            if not ok:
                unschedulable.add(node_id)
        else:
            scalars.append((node_id, resource, peak, cap))
    return _ExceptionRows(booked, unavailable, reasons, frozenset(unschedulable), scalars)


# ------------------------------------------------------------------ reads shared by a batch's plans


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
class _Group:
    """One exceptions read of a batch and the batch's plans over it: ``booked`` holds the read's
    bookings, the process's assumptions at read time and the overlapping plans' atoms; ``extra`` node id
    -> resource -> the overlapping plans' amounts; ``scalars`` the ``node_resources`` rows with their
    peaks over the window read so far (:data:`INSIDE_SCALARS`, without ``extra``)."""

    cache: PoolCache
    pool_id: str
    start: datetime
    end: datetime
    names: list[str]
    rows: _ExceptionRows
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
        for r in (await _INSIDE_SCALARS.run(conn, params)).all():
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
    groups: dict[GroupKey, _Group]

    def usable(self, head: PoolHead, most: Mapping[tuple[Any, ...], Decimal]) -> dict[GroupKey, _Group]:
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
        self.free_groups: dict[GroupKey, _Group] = warm.usable(head, self._most) if warm is not None else {}
        self._planned: list[BatchPlanned] = []

    def warm(self) -> WarmReads:
        """This batch's groups for the next batch of the pool, once this batch's transaction committed
        with every plan made on them (none lost a race, none was refused or preempted)."""
        for group in self.free_groups.values():
            group.carry()
        return WarmReads(self.head.inventory_version, dict(self.free_groups))

    def add(self, planned: BatchPlanned) -> None:
        """A plan of the batch: the plans after it see it."""
        self._planned.append(planned)
        for group in self.free_groups.values():
            group.take(planned)

    def _covering(self, request: PlacementRequest) -> _Group | None:
        """The group whose read serves ``request``: its own window's, else (with ``slack``) one of the
        same resource names and tenant whose read window contains the request's."""
        key = group_key(request)
        found = self.free_groups.get(key)
        if found is not None or not self.slack:
            return found
        start, end, *kind = key
        for (g_start, g_end, *g_kind), group in self.free_groups.items():
            if g_kind == kind and g_start <= start and end <= g_end:
                return group
        return None

    async def group(self, conn: AsyncConnection, request: PlacementRequest) -> _Group:
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
            rows = await _read_exceptions(conn, params, bool(names))
            self.reads += 1
            booked = rows.booked
            for node_id, atoms in live.items():
                booked.setdefault(node_id, set()).update(atoms)
            most = Decimal(params.get("most", 0))
            found = _Group(self.cache, request.pool_id, start, end, list(names), rows, booked, mark, most)
            found.read_at = time.monotonic()
            self.free_groups[(start, end, names, tolerated)] = found
            for planned in self._planned:
                found.take(planned)
        found.catch_up()
        return found

    async def exceptions(self, conn: AsyncConnection, request: PlacementRequest) -> tuple[_Group, Exceptions]:
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
            group: _Group | None = None
            if shared is not None:
                group, exceptions = await shared.exceptions(conn, request)
            else:
                exceptions = await read_exceptions(
                    conn, request, cache.assumed(request.pool_id, request.start, request.end)
                )
            # a batch's group ranks 2K: the next K are read ahead with the first fetch they need
            rows = shortlist_rows(inventory, request, options, exceptions, 2 * k if group else k + 1, group)
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
    head, snapshot = await read_snapshot(conn, cache, request.pool_id, request.start, request.end, head=head)
    if shared is not None:
        snapshot = shared.overlay(snapshot, request)
    planner = plan_gang if request.gang is not None and request.gang.members > 1 else plan_placement
    return PlanOutcome(head, planner(request, snapshot, options), "full")


async def _inside_states(
    conn: AsyncConnection,
    inside: list[str],
    request: PlacementRequest,
    exceptions: Exceptions,
    group: _Group | None = None,
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
        for r in (await _INSIDE_SCALARS.run(conn, params)).all():
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
