"""The shortlist's narrow SQL reads (docs/architecture.md, "planning"): what is not simply free and
schedulable in a pool over a window.

:func:`exceptions_statement` / :func:`read_exceptions`: bookings that overlap the window, unhealthy or
unbookable atoms (a partial index), nodes with NoSchedule reasons judged by the commit's own predicate
(``schedulable_sql_within``), and nodes without room for a requested scalar (``SCALAR_EXCEPTIONS``),
answered as the pure :class:`app.placement.shortlist.Exceptions` value. ``INSIDE_SCALARS`` reads the
shortlisted nodes' scalar rows with the peak each holds over the window.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.planning.snapshot import scalar_peaks, scalar_rows_sql
from app.capacity.predicates import schedulable_sql_within, tolerated_reasons
from app.db.prepared import Prepared
from app.db.tables import TS, device_bookings, devices, node_resources, nodes, pools, scalar_holdings
from app.db.windows import overlapping, window
from app.placement.model import (
    PlacementRequest,
)
from app.placement.shortlist import (
    Exceptions,
)

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
        nodes.c.deleted_at.is_(None),
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
# the shortlisted nodes' rows of the requested resources with their peaks, built once:
#   SELECT r.node_id, r.resource, r.allocatable, r.ratio, coalesce(p.peak, 0) AS held
#     FROM node_resources r
#     LEFT JOIN (<peak per node and resource over the window, holdings of the :inside nodes only>) p
#       USING (node_id, resource)
#    WHERE r.node_id = ANY(:inside) AND r.resource = ANY(:names)
INSIDE_SCALARS = scalar_rows_sql(
    [node_resources.c.node_id == sa.any_(_INSIDE), node_resources.c.resource == sa.any_(_NAMES)],
    [scalar_holdings.c.node_id == sa.any_(_INSIDE), scalar_holdings.c.resource == sa.any_(_NAMES)],
    *_WINDOW,
)
INSIDE_SCALARS_READ = Prepared(INSIDE_SCALARS)


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
        .where(
            nodes.c.pool_id == _POOL,
            nodes.c.deleted_at.is_(None),
            sa.not_(sa.and_(devices.c.healthy, devices.c.bookable)),
        )
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
        .where(
            nodes.c.pool_id == _POOL,
            nodes.c.deleted_at.is_(None),
            nodes.c.no_schedule_reasons != sa.text("'{}'::text[]"),
        ),
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
    read = await read_exception_rows(conn, exceptions_params(request), bool(request.resources))
    short, peaks = read.scalar_short(request.resources)
    booked = read.booked
    for node_id, atoms in (assumed or {}).items():  # other plans of this process are committing these
        booked.setdefault(node_id, set()).update(atoms)
    return Exceptions(booked, read.unavailable, read.reasons, read.unschedulable, frozenset(short), peaks)


@dataclass(frozen=True, slots=True)
class ExceptionRows:
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


async def read_exception_rows(
    conn: AsyncConnection, params: Mapping[str, Any], with_scalars: bool
) -> ExceptionRows:
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
    return ExceptionRows(booked, unavailable, reasons, frozenset(unschedulable), scalars)
