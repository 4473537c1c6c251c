"""The guarded commit of planned nodes (docs/placement-rules.md, "Commit and lock order"), in two round
trips a node.

Inside ``SAVEPOINT capacity_place_<attempt>`` every guard re-checks what the plan assumed and answers
with fewer rows instead of raising. The guards are parts (CTEs) of two statements, in this order:

the lock statement (:func:`lock_statement`), one ``SELECT`` whose parts run left to right:

1. the node is still schedulable for the tenant (``FOR SHARE OF n``), and its labels the request asks
   for, re-read under that lock (a label that went away is a lost race, docs/placement-rules.md nodeLabels
   paragraph): :func:`node_lost`;
2. the picked atoms are still healthy and bookable (``FOR SHARE``): :func:`atoms_lost`;
3. the node's ``node_resources`` rows of the requested scalars (``FOR UPDATE``): they serialize the
   holders of one node and resource; :func:`scalars_lost`;
4. when the commit charges quota, the tenant's ``quota_usage`` rows (``FOR UPDATE``, sorted): they
   serialize the charges of one tenant, pool and resource, last in the lock order so the quota row is
   held from here to ``COMMIT`` only (:func:`quota_unlocked`);

the write statement (:func:`write_statement`), whose snapshot is taken after every lock above was
granted, so each guard sees every holding committed by the transactions that held the lock before (a
guard in the locking statement itself would not: PostgreSQL re-checks a locked row's own columns, not a
subquery's rows):

5. the allocation row (the bookings and holdings refer to it);
6. the bookings insert with ``ON CONFLICT DO NOTHING RETURNING``: fewer rows = booked meanwhile
   (:func:`bookings_lost`). A whole-node lease books its held atoms too (those unhealthy or unbookable
   when it was planned, ``Candidate.held_atoms``), so the bookings' exclusion constraint keeps every
   other booking off the leased node for the window whatever its atoms' health (docs/lifecycle.md,
   "Whole-node leases");
7. each scalar is held per instant over the window: ``INSERT INTO scalar_holdings ... SELECT ... WHERE
   peak + n <= floor(allocatable * ratio) RETURNING``, the peak being the most the node's holdings of
   that resource hold at any instant of ``[start, end)`` (:mod:`app.db.windows`): a resource missing =
   ran out (:func:`holdings_lost`);
8. when the commit charges quota, the quota holdings (``app.quota.charges.HOLD_QUOTA``): a resource
   missing = over its limit somewhere in the window, raised as 409 QUOTA_EXCEEDED
   (:func:`quota_refused`);
9. when asked, the reservation row is marked ``placed`` (:class:`MarkPlaced`).

A short answer rolls back to the savepoint (which also drops the locks taken in it, the quota row's
among them) and returns a :class:`LostRace` with one of the four reasons; the placer excludes the node
or reads it again and replans. Under READ COMMITTED two conflicting booking inserts may also end in a
deadlock (40P01) or an exclusion violation (23P01) instead of DO NOTHING: both are the same lost race,
never a 500 (docs/architecture.md). The savepoint is not released: ``COMMIT`` keeps it, one
round trip fewer.

Lock order (every capacity path, docs/lifecycle.md): the reservation's own row -> pools (``FOR SHARE``,
taken by the caller) -> nodes -> devices -> node_resources -> quota_usage. No commit writes
pool_capacity_rollup, which holds capacity totals only (what is held is counted per instant). A gang
locks its members in node id order and charges quota with its last member.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.commit.lost_races import (
    LostRace,
    atoms_lost,
    booked_concurrently,
    bookings_lost,
    holdings_lost,
    node_lost,
    scalars_lost,
)
from app.capacity.commit.shapes import NO_EXTRAS, CommitExtras, Committed, QuotaCharge
from app.capacity.predicates import (
    leasable_sql_within,
    own_dedication,
    schedulable_sql_within,
    tolerated_reasons,
)
from app.db.prepared import Prepared
from app.db.tables import (
    TS,
    allocations,
    device_bookings,
    devices,
    node_labels,
    node_resources,
    nodes,
    pools,
    reservations,
    scalar_holdings,
)
from app.db.unnest import wanted_amounts
from app.db.windows import room_for, window
from app.ids import new_id
from app.placement.model import Candidate, PlacementRequest
from app.quota import charges


async def commit_placements(
    conn: AsyncConnection,
    request: PlacementRequest,
    candidates: tuple[Candidate, ...],
    reservation_id: str,
    attempt: int,
    start: datetime,
    end: datetime,
    extras: CommitExtras = NO_EXTRAS,
) -> tuple[Committed, ...] | LostRace:
    """Write every candidate (a gang's members, on distinct nodes) in one
    ``SAVEPOINT capacity_place_<attempt>``: all of them, or, on the first lost race, none (rolled back
    to the savepoint). Members are written in node id order, so two gangs lock shared nodes in the same
    order; ``extras`` (quota charge, placed mark) ride with the last. Returns the allocations in the
    candidates' order. Raises QuotaExceeded (the caller's transaction must roll back, or its own
    savepoint) and errors that are not lost races."""
    savepoint = f"capacity_place_{int(attempt)}"
    await conn.exec_driver_sql(f"SAVEPOINT {savepoint}")
    ordered = sorted(candidates, key=lambda c: c.node_id)
    written: dict[str, Committed] = {}
    outcome: LostRace | None = None
    for i, candidate in enumerate(ordered):
        last = i == len(ordered) - 1
        try:
            result = await _commit_node(
                conn, request, candidate, reservation_id, start, end, extras if last else NO_EXTRAS
            )
        except DBAPIError as exc:
            result = booked_concurrently(exc, candidate.node_id, candidate.node_name)
        if isinstance(result, LostRace):
            outcome = result
            break
        written[candidate.node_id] = result
    if outcome is not None:
        await conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {savepoint}")
        return outcome
    return tuple(written[c.node_id] for c in candidates)


async def _commit_node(
    conn: AsyncConnection,
    request: PlacementRequest,
    candidate: Candidate,
    reservation_id: str,
    start: datetime,
    end: datetime,
    extras: CommitExtras,
) -> Committed | LostRace:
    """The two statements of one node: lock and check, then write and check."""
    charge = extras.charge
    wanted = charge.wanted if charge is not None else {}
    locked = await run_lock_statement(conn, request, candidate, sorted(wanted) if wanted else None)
    lost = (
        node_lost(locked, request, candidate)
        or atoms_lost(locked, candidate)
        or scalars_lost(locked, candidate)
    )
    if lost is not None:
        return lost
    if charge is not None and wanted and quota_unlocked(locked, wanted):
        await charges.lock_first_usage_rows(conn, charge.tenant_id, charge.pool_id, sorted(wanted))
    allocation_id = new_id("alloc")
    written = await run_write_statement(
        conn, request, candidate, reservation_id, allocation_id, start, end, extras
    )
    lost = bookings_lost(written, candidate) or holdings_lost(written, candidate)
    if lost is not None:
        return lost
    if charge is not None:
        await quota_refused(conn, written, charge)
    classes: dict[str, Decimal] = {}
    for device_class in locked.atom_classes or ():
        classes[device_class] = classes.get(device_class, Decimal(0)) + 1
    return Committed(
        allocation_id, candidate.node_id, tuple(candidate.atoms), dict(candidate.resources), classes
    )


# --- the lock statement -------------------------------------------------------------------------------

_NODE = sa.bindparam("node_id", type_=sa.Text)
_POOL = sa.bindparam("pool_id", type_=sa.Text)
_ATOMS = sa.bindparam("atoms", type_=pg.ARRAY(sa.Text))
# the atoms booked: the picked ones and a whole-node lease's held ones (Candidate.booked_atoms)
_BOOKED = sa.bindparam("booked_atoms", type_=pg.ARRAY(sa.Text))
_SCALARS = sa.bindparam("scalars", type_=pg.ARRAY(sa.Text))
_KEYS = sa.bindparam("label_keys", type_=pg.ARRAY(sa.Text))


def _raw_array(expr: Any) -> Any:
    return sa.func.array_agg(expr, type_=sa.types.NullType())


def _count(cte: Any) -> Any:
    return sa.select(sa.func.count()).select_from(cte).scalar_subquery()


_TOLERATED = sa.bindparam("tolerated", type_=pg.ARRAY(sa.Text))  # tolerated_reasons(tenant)
_OWN = sa.bindparam("own_dedication", type_=sa.Text)  # own_dedication(tenant), NULL for no tenant


@cache
def lock_statement(whole_node: bool, with_labels: bool, with_quota: bool) -> Prepared:
    """The guards 1-4 as one ``SELECT`` (parts left to right, so locks are taken in the lock order)::

        SELECT (SELECT count(*) FROM (SELECT n.id FROM nodes n JOIN pools p ON p.id = n.pool_id
                  WHERE n.id = :node_id AND n.pool_id = :pool_id AND <schedulable for tenant>
                  FOR SHARE OF n) node) AS node,                   -- 0: no longer schedulable
               (SELECT array_agg(ARRAY[key, value, source]) FROM node_labels
                 WHERE node_id = :node_id AND key = ANY(:label_keys)) AS labels,   -- with nodeLabels only
               (SELECT array_agg(class) FROM (SELECT id, class FROM devices WHERE id = ANY(:atoms)
                  AND node_id = :node_id AND healthy AND bookable ORDER BY id FOR SHARE) atoms)
                 AS atom_classes,                                 -- fewer: unhealthy or unbookable
               (SELECT count(*) FROM (SELECT resource FROM node_resources WHERE node_id = :node_id
                  AND resource = ANY(:scalars) ORDER BY resource FOR UPDATE) scalars) AS scalars,
               (SELECT count(*) FROM (<app.quota.charges.LOCK_USAGE>) usage) AS usage
                                                      -- with a quota charge only; fewer: a first charge

    Built and compiled once per shape (``whole_node``: a ``binding: node`` lease, guarded by
    ``leasable_sql_within``, else ``schedulable_sql_within``; ``with_labels``: the request has
    nodeLabels; ``with_quota``: the commit charges quota) from bind parameters only, the tenant's
    dedication among them (``tolerated``, ``own_dedication``), and run prepared
    (:class:`app.db.prepared.Prepared`, issue 15: no per-call construct, cache key or compile)."""
    node = (
        sa.select(nodes.c.id)
        .select_from(nodes.join(pools, pools.c.id == nodes.c.pool_id))
        .where(
            nodes.c.id == _NODE,
            nodes.c.pool_id == _POOL,
            # a whole-node lease ignores NoSchedule reasons but dedications (docs/placement-rules.md,
            # leasableSqlFor)
            leasable_sql_within(_OWN) if whole_node else schedulable_sql_within(_TOLERATED),
        )
        .with_for_update(read=True, of=nodes)
        .subquery("node")
    )
    atoms = (
        sa.select(devices.c.id, devices.c["class"].label("device_class"))
        .where(
            devices.c.id == sa.any_(_ATOMS), devices.c.node_id == _NODE, devices.c.healthy, devices.c.bookable
        )
        .order_by(devices.c.id)
        .with_for_update(read=True)
        .subquery("atoms")
    )
    scalars = (
        sa.select(node_resources.c.resource)
        .where(node_resources.c.node_id == _NODE, node_resources.c.resource == sa.any_(_SCALARS))
        .order_by(node_resources.c.resource)
        .with_for_update()
        .subquery("scalars")
    )
    columns: list[Any] = [_count(node).label("node")]
    if with_labels:
        triple = pg.array([node_labels.c.key, node_labels.c.value, node_labels.c.source])
        columns.append(
            sa.select(_raw_array(triple))
            .where(node_labels.c.node_id == _NODE, node_labels.c.key == sa.any_(_KEYS))
            .scalar_subquery()
            .label("labels")
        )
    columns.append(sa.select(_raw_array(atoms.c.device_class)).scalar_subquery().label("atom_classes"))
    columns.append(_count(scalars).label("scalars"))
    if with_quota:
        columns.append(_count(charges.LOCK_USAGE.subquery("usage")).label("usage"))
    return Prepared(sa.select(*columns))


async def run_lock_statement(
    conn: AsyncConnection, request: PlacementRequest, candidate: Candidate, charged: list[str] | None
) -> Any:
    """Run :func:`lock_statement` for ``candidate`` (``charged``: the quota resources to lock, sorted);
    its one row."""
    whole_node = request.binding == "node"
    params: dict[str, Any] = {
        "node_id": candidate.node_id,
        "pool_id": request.pool_id,
        "atoms": list(candidate.atoms),
        "scalars": sorted(candidate.resources),
    }
    if whole_node:
        params["own_dedication"] = own_dedication(request.tenant_id)
    else:
        params["tolerated"] = tolerated_reasons(request.tenant_id)
    if request.node_labels:
        params["label_keys"] = list(request.node_labels)
    if charged:
        params.update(tenant_id=request.tenant_id, resources=charged)
    statement = lock_statement(whole_node, bool(request.node_labels), bool(charged))
    return (await statement.run(conn, params)).one()


def quota_unlocked(locked: Any, wanted: Mapping[str, Decimal]) -> bool:
    """Guard 4: ``<LOCK_USAGE>`` locked fewer ``quota_usage`` rows than charged resources: a first
    charge, whose rows the caller inserts and locks (:func:`app.quota.charges.lock_first_usage_rows`)."""
    return bool(locked.usage < len(wanted))


# --- the write statement ------------------------------------------------------------------------------

_ALLOC = sa.bindparam("allocation_id", type_=sa.Text)
_RESERVATION = sa.bindparam("reservation_id", type_=sa.Text)
_DURING = sa.bindparam("during", type_=device_bookings.c.during.type)
_STARTS = sa.bindparam("starts_at", type_=TS)
_ENDS = sa.bindparam("ends_at", type_=TS)
# unnest(:scalar_names, :scalar_amounts) AS wanted(resource, amount)
_WANTED = wanted_amounts("scalar_names", "scalar_amounts")


@cache
def write_statement(with_quota: bool, with_mark: bool) -> Prepared:
    """The writes 5-9 as one statement, built and compiled once per shape (bind parameters only) and
    run prepared (:class:`app.db.prepared.Prepared`)::

    WITH alloc AS (INSERT INTO allocations (id, reservation_id, pool_id, node_id, atoms, resources,
                   during) VALUES (:allocation_id, :reservation_id, :pool_id, :node_id, :atoms,
                   :resources, :during) RETURNING id),
         booked AS (INSERT INTO device_bookings (device_pk, device_id, pool_id, allocation_id, during)
                    SELECT pk, id, :pool_id, :allocation_id, :during FROM devices
                     WHERE id = ANY(:booked_atoms) AND node_id = :node_id
                    ON CONFLICT DO NOTHING RETURNING device_id),     -- fewer rows: booked meanwhile
         held AS (INSERT INTO scalar_holdings (allocation_id, resource, node_id, pool_id, amount,
                  starts_at, ends_at)
                  SELECT :allocation_id, w.resource, :node_id, :pool_id, w.amount, :starts_at, :ends_at
                    FROM unnest(:scalar_names, :scalar_amounts) AS wanted(resource, amount)
                    JOIN node_resources nr ON nr.node_id = :node_id AND nr.resource = w.resource
                   WHERE (<peak of the node's w.resource holdings over [:starts_at, :ends_at),
                          app/db/windows.py>) + w.amount <= floor(nr.allocatable * nr.ratio)
                  RETURNING resource),                               -- one missing: ran out
         quota AS (<app.quota.charges.HOLD_QUOTA>),                  -- one missing: over quota
         marked AS (UPDATE reservations SET status = 'placed', conditions = '[]', ends_at = :ends_at,
                    updated_at = now() WHERE id = :reservation_id RETURNING id)
    SELECT (SELECT count(*) FROM booked) AS booked,
           (SELECT array_agg(resource) FROM held) AS held,
           (SELECT array_agg(resource) FROM quota) AS quota          -- with a quota charge only
    """
    alloc = (
        sa.insert(allocations)
        .values(
            id=_ALLOC,
            reservation_id=_RESERVATION,
            pool_id=_POOL,
            node_id=_NODE,
            atoms=_ATOMS,
            resources=sa.bindparam("resources_json", type_=allocations.c.resources.type),
            during=_DURING,
        )
        .returning(allocations.c.id)
        .cte("alloc")
    )
    booked = (
        pg_insert(device_bookings)
        .from_select(
            ["device_pk", "device_id", "pool_id", "allocation_id", "during"],
            sa.select(devices.c.pk, devices.c.id, _POOL, _ALLOC, _DURING).where(
                devices.c.id == sa.any_(_BOOKED), devices.c.node_id == _NODE
            ),
        )
        .on_conflict_do_nothing()
        .returning(device_bookings.c.device_id)
        .cte("booked")
    )
    cap = sa.func.floor(node_resources.c.allocatable * node_resources.c.ratio)
    held = (
        sa.insert(scalar_holdings)
        .from_select(
            ["allocation_id", "resource", "node_id", "pool_id", "amount", "starts_at", "ends_at"],
            sa.select(_ALLOC, _WANTED.c.resource, _NODE, _POOL, _WANTED.c.amount, _STARTS, _ENDS)
            .select_from(
                _WANTED.join(
                    node_resources,
                    sa.and_(
                        node_resources.c.node_id == _NODE, node_resources.c.resource == _WANTED.c.resource
                    ),
                )
            )
            .where(
                room_for(
                    scalar_holdings,
                    [scalar_holdings.c.node_id == _NODE, scalar_holdings.c.resource == _WANTED.c.resource],
                    _STARTS,
                    _ENDS,
                    _WANTED.c.amount,
                    cap,
                    (_WANTED, node_resources),
                )
            ),
        )
        .returning(scalar_holdings.c.resource)
        .cte("held")
    )
    columns: list[Any] = [
        _count(booked).label("booked"),
        sa.select(_raw_array(held.c.resource)).scalar_subquery().label("held"),
    ]
    ctes: list[Any] = [alloc]
    if with_quota:
        charged = charges.HOLD_QUOTA.cte("quota")
        columns.append(sa.select(_raw_array(charged.c.resource)).scalar_subquery().label("quota"))
    if with_mark:
        ctes.append(
            sa.update(reservations)
            .where(reservations.c.id == _RESERVATION)
            .values(
                status=sa.literal_column("'placed'"),
                conditions=sa.text("'[]'::jsonb"),
                ends_at=_ENDS,
                updated_at=sa.func.now(),
            )
            .returning(reservations.c.id)
            .cte("marked")
        )
    return Prepared(sa.select(*columns).add_cte(*ctes))


async def run_write_statement(
    conn: AsyncConnection,
    request: PlacementRequest,
    candidate: Candidate,
    reservation_id: str,
    allocation_id: str,
    start: datetime,
    end: datetime,
    extras: CommitExtras,
) -> Any:
    """Run :func:`write_statement` for ``candidate``; its one row."""
    names = sorted(candidate.resources)
    params: dict[str, Any] = {
        "allocation_id": allocation_id,
        "reservation_id": reservation_id,
        "pool_id": request.pool_id,
        "node_id": candidate.node_id,
        "atoms": list(candidate.atoms),
        "booked_atoms": list(candidate.booked_atoms),
        "resources_json": {k: str(v) for k, v in candidate.resources.items()},
        "during": window(start, end),
        "starts_at": start,
        "ends_at": end,
        "scalar_names": names,
        "scalar_amounts": [Decimal(candidate.resources[n]) for n in names],
    }
    charge = extras.charge
    with_quota = charge is not None and bool(charge.wanted)
    if charge is not None and with_quota:
        held = charges.hold_params(
            charge.tenant_id, charge.pool_id, charge.reservation_id, charge.wanted, charge.start, charge.end
        )
        # the quota window may differ from the node's (never today): HOLD_QUOTA has its own names
        assert held["starts_at"] == start and held["ends_at"] == end
        params.update(tenant_id=held["tenant_id"], resources=held["resources"], amounts=held["amounts"])
    if extras.mark is not None:
        assert extras.mark.reservation_id == reservation_id and extras.mark.end == end
    statement = write_statement(with_quota, extras.mark is not None)
    return (await statement.run(conn, params)).one()


async def quota_refused(conn: AsyncConnection, written: Any, charge: QuotaCharge) -> None:
    """Write 8: ``<HOLD_QUOTA> RETURNING resource`` left a charged resource out: raise 409
    QUOTA_EXCEEDED for the first in sorted order (:func:`app.quota.charges.refusal`)."""
    wanted = charge.wanted
    held = set(getattr(written, "quota", None) or ())
    refused = next((r for r in sorted(wanted) if r not in held), None)
    if refused is not None:
        raise await charges.refusal(
            conn, charge.tenant_id, charge.pool_id, refused, wanted[refused], charge.start, charge.end
        )
