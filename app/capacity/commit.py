"""The guarded commit of one planned node (seed 000, "Commit and lock order").

Inside ``SAVEPOINT capacity_place_<attempt>`` every statement re-checks what the plan assumed and
answers with fewer rows instead of raising:

1. the node is still schedulable for the tenant (``FOR SHARE OF n``) and still carries the labels the
   request asks for (re-read under that lock: a label that went away is a lost race, seed 000
   nodeLabels paragraph);
2. the picked atoms are still healthy and bookable (``FOR SHARE``);
3. the bookings insert with ``ON CONFLICT DO NOTHING RETURNING``: fewer rows = booked meanwhile;
4. each scalar is held per instant over the window: under the ``node_resources`` row lock (``FOR
   UPDATE``), ``INSERT INTO scalar_holdings ... SELECT ... WHERE peak + n <= floor(allocatable * ratio)
   RETURNING``, where the peak is the most the node's holdings of that resource hold at any instant of
   ``[start, end)`` (:mod:`app.db.windows`): no row = ran out;
5. the allocation row (written first, as the bookings and holdings refer to it).

A short answer rolls back to the savepoint and returns a :class:`LostRace` with one of the four reasons;
the placer excludes the node and replans. Under READ COMMITTED two conflicting booking inserts may also
end in a deadlock (40P01) or an exclusion violation (23P01) instead of DO NOTHING: both are the same lost
race, never a 500 (DESIGN.md, "Concurrency facts"). Lock order: nodes -> devices -> node_resources
(quota_usage and pools are taken by the caller before); no commit writes pool_capacity_rollup, which
holds capacity totals only (what is held is counted per instant).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.predicates import leasable_sql_for, schedulable_sql_tolerating
from app.capacity.snapshot import window
from app.db.tables import (
    allocations,
    device_bookings,
    devices,
    node_labels,
    node_resources,
    nodes,
    pools,
    scalar_holdings,
)
from app.db.windows import hold_if, holding_params, room_for
from app.ids import new_id
from app.placement.model import Candidate, PlacementRequest
from app.placement.system_labels import ANY_LABEL_VALUE, label_counts

LOST_RACE_SQLSTATES = frozenset({"40P01", "23P01"})  # deadlock detected, exclusion violation
# the kinds of seed 000's four lost-race reasons, in the reasons' order
NOT_SCHEDULABLE = "not_schedulable"
ATOM_UNHEALTHY = "atom_unhealthy"
ATOM_BOOKED = "atom_booked"
SCALAR_RAN_OUT = "scalar_ran_out"
LOST_RACE_KINDS = (NOT_SCHEDULABLE, ATOM_UNHEALTHY, ATOM_BOOKED, SCALAR_RAN_OUT)


@dataclass(frozen=True, slots=True)
class Committed:
    """The allocation written for a candidate: ``{id, nodeId, atoms, resources, start, end}``."""

    allocation_id: str
    node_id: str
    atoms: tuple[str, ...]
    resources: Mapping[str, Decimal]
    classes: Mapping[str, Decimal] = field(default_factory=dict)  # atoms per device class


@dataclass(frozen=True, slots=True)
class LostRace:
    """The commit lost a race; ``reason`` is one of seed 000's four texts (naming the node), ``kind`` its
    bounded class, one of :data:`LOST_RACE_KINDS` (the ``reason`` label of ``bc_lost_races_total``)."""

    node_id: str
    reason: str
    kind: str


def sqlstate(exc: DBAPIError) -> str | None:
    """The PostgreSQL SQLSTATE of a driver error (``40P01``, ``23P01``, ``23503``, ...), if any."""
    orig = exc.orig
    return getattr(orig, "sqlstate", None) or getattr(getattr(orig, "__cause__", None), "sqlstate", None)


def labels_hold(wanted: Mapping[str, str], have: Mapping[str, tuple[str, str]]) -> bool:
    """Do the node's labels (key -> (value, source)) satisfy ``wanted`` (``'*'`` = any value)?
    A ``bc.dev/`` label counts only when its source is ``system`` (seed 000)."""
    for key, value in wanted.items():
        got = have.get(key)
        if got is None or not label_counts(key, got[1]):
            return False
        if value != ANY_LABEL_VALUE and got[0] != value:
            return False
    return True


async def commit_candidate(
    conn: AsyncConnection,
    request: PlacementRequest,
    candidate: Candidate,
    reservation_id: str,
    attempt: int,
    start: datetime,
    end: datetime,
) -> Committed | LostRace:
    """Write ``candidate`` for ``request`` inside ``SAVEPOINT capacity_place_<attempt>``.

    Returns :class:`Committed` (savepoint released) or :class:`LostRace` (rolled back to the savepoint,
    nothing written). Raises only for errors that are not lost races.
    """
    outcome = await commit_placements(conn, request, (candidate,), reservation_id, attempt, start, end)
    return outcome if isinstance(outcome, LostRace) else outcome[0]


async def commit_placements(
    conn: AsyncConnection,
    request: PlacementRequest,
    candidates: tuple[Candidate, ...],
    reservation_id: str,
    attempt: int,
    start: datetime,
    end: datetime,
) -> tuple[Committed, ...] | LostRace:
    """Write every candidate (a gang's members, on distinct nodes) in one
    ``SAVEPOINT capacity_place_<attempt>``: all of them, or, on the first lost race, none (rolled back
    to the savepoint). Members are written in node id order, so two gangs lock shared nodes in the same
    order. Returns the allocations in the candidates' order."""
    savepoint = f"capacity_place_{int(attempt)}"
    await conn.exec_driver_sql(f"SAVEPOINT {savepoint}")
    written: dict[str, Committed] = {}
    outcome: LostRace | None = None
    for candidate in sorted(candidates, key=lambda c: c.node_id):
        try:
            result = await _guarded_writes(conn, request, candidate, reservation_id, start, end)
        except DBAPIError as exc:
            if sqlstate(exc) not in LOST_RACE_SQLSTATES:
                raise
            result = LostRace(
                candidate.node_id, f"an atom on {candidate.node_name} was booked concurrently", ATOM_BOOKED
            )
        if isinstance(result, LostRace):
            outcome = result
            break
        written[candidate.node_id] = result
    if outcome is not None:
        await conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {savepoint}")
    await conn.exec_driver_sql(f"RELEASE SAVEPOINT {savepoint}")
    if outcome is not None:
        return outcome
    return tuple(written[c.node_id] for c in candidates)


async def _guarded_writes(
    conn: AsyncConnection,
    request: PlacementRequest,
    candidate: Candidate,
    reservation_id: str,
    start: datetime,
    end: datetime,
) -> Committed | LostRace:
    node, name = candidate.node_id, candidate.node_name
    # SELECT n.id FROM nodes n JOIN pools p ON p.id = n.pool_id
    #  WHERE n.id = :node AND n.pool_id = :pool AND <schedulable for tenant> FOR SHARE OF n
    still = (
        await conn.execute(
            sa.select(nodes.c.id)
            .select_from(nodes.join(pools, pools.c.id == nodes.c.pool_id))
            .where(
                nodes.c.id == node,
                nodes.c.pool_id == request.pool_id,
                # a whole-node lease ignores NoSchedule reasons but dedications (seed 000, leasableSqlFor)
                leasable_sql_for(request.tenant_id)
                if request.binding == "node"
                else schedulable_sql_tolerating(request.tenant_id),
            )
            .with_for_update(read=True, of=nodes)
        )
    ).first()
    if still is None:
        return LostRace(node, f"{name} is no longer schedulable", NOT_SCHEDULABLE)
    if request.node_labels:
        # the locked node's labels again: one that went away since the plan is a lost race
        have = {
            r.key: (r.value, r.source)
            for r in (
                await conn.execute(
                    sa.select(node_labels.c.key, node_labels.c.value, node_labels.c.source).where(
                        node_labels.c.node_id == node, node_labels.c.key.in_(list(request.node_labels))
                    )
                )
            ).all()
        }
        if not labels_hold(request.node_labels, have):
            return LostRace(node, f"{name} is no longer schedulable", NOT_SCHEDULABLE)

    atoms = list(candidate.atoms)
    classes: dict[str, Decimal] = {}
    if atoms:
        # SELECT id, class FROM devices WHERE id = ANY(:atoms) AND node_id = :node
        #   AND healthy AND bookable ORDER BY id FOR SHARE
        healthy = (
            await conn.execute(
                sa.select(devices.c.id, devices.c["class"])
                .where(
                    devices.c.id.in_(atoms), devices.c.node_id == node, devices.c.healthy, devices.c.bookable
                )
                .order_by(devices.c.id)
                .with_for_update(read=True)
            )
        ).all()
        if len(healthy) != len(atoms):
            return LostRace(node, f"an atom on {name} turned unhealthy or unbookable", ATOM_UNHEALTHY)
        for r in healthy:
            classes[r[1]] = classes.get(r[1], Decimal(0)) + 1

    allocation_id = new_id("alloc")
    during = window(start, end)
    await conn.execute(
        sa.insert(allocations).values(
            id=allocation_id,
            reservation_id=reservation_id,
            pool_id=request.pool_id,
            node_id=node,
            atoms=atoms,
            resources={k: str(v) for k, v in candidate.resources.items()},
            during=during,
        )
    )
    if atoms:
        # INSERT INTO device_bookings (device_pk, device_id, pool_id, allocation_id, during)
        #   SELECT pk, id, :pool, :alloc, tstzrange(:start, :end, '[)') FROM devices WHERE id = ANY(:atoms)
        #   ON CONFLICT DO NOTHING RETURNING device_id                  -- fewer rows: booked meanwhile
        source = sa.select(
            devices.c.pk,
            devices.c.id,
            sa.literal(request.pool_id, sa.Text),
            sa.literal(allocation_id, sa.Text),
            sa.literal(during, device_bookings.c.during.type),
        ).where(devices.c.id.in_(atoms))
        booked = (
            await conn.execute(
                pg_insert(device_bookings)
                .from_select(["device_pk", "device_id", "pool_id", "allocation_id", "during"], source)
                .on_conflict_do_nothing()
                .returning(device_bookings.c.device_id)
            )
        ).all()
        if len(booked) != len(atoms):
            return LostRace(node, f"an atom on {name} was booked concurrently", ATOM_BOOKED)

    for resource, n in sorted(candidate.resources.items()):
        if not await _hold_scalar(
            conn, request.pool_id, node, allocation_id, resource, Decimal(n), start, end
        ):
            return LostRace(node, f"{resource} on {name} ran out", SCALAR_RAN_OUT)

    return Committed(allocation_id, node, tuple(atoms), dict(candidate.resources), classes)


_H = holding_params(scalar_holdings)
# SELECT 1 FROM node_resources WHERE node_id = :node_id AND resource = :resource FOR UPDATE
LOCK_SCALAR = (
    sa.select(sa.literal(1))
    .select_from(node_resources)
    .where(node_resources.c.node_id == _H["node_id"], node_resources.c.resource == _H["resource"])
    .with_for_update()
)
# INSERT INTO scalar_holdings (allocation_id, resource, node_id, pool_id, amount, starts_at, ends_at)
# SELECT :allocation_id, :resource, :node_id, :pool_id, :amount, :starts_at, :ends_at FROM node_resources nr
#  WHERE nr.node_id = :node_id AND nr.resource = :resource
#    AND (<peak of the node's :resource holdings over [:starts_at, :ends_at), app/db/windows.py>) + :amount
#        <= floor(nr.allocatable * nr.ratio)              -- windows.room_for: the sweep only if needed
# RETURNING allocation_id                                  -- no row: ran out
HOLD_SCALAR = hold_if(
    scalar_holdings,
    _H,
    node_resources.c.node_id == _H["node_id"],
    node_resources.c.resource == _H["resource"],
    room_for(
        scalar_holdings,
        [scalar_holdings.c.node_id == _H["node_id"], scalar_holdings.c.resource == _H["resource"]],
        _H["starts_at"],
        _H["ends_at"],
        _H["amount"],
        sa.func.floor(node_resources.c.allocatable * node_resources.c.ratio),
    ),
)


async def _hold_scalar(
    conn: AsyncConnection,
    pool_id: str,
    node_id: str,
    allocation_id: str,
    resource: str,
    n: Decimal,
    start: datetime,
    end: datetime,
) -> bool:
    """Hold ``n`` of ``resource`` on the node over ``[start, end)`` if the peak held there leaves room;
    False when it does not (or the node has no such resource): the node "ran out".

    The ``node_resources`` row lock serializes the holders of one node and resource (lock order: after
    nodes and devices). The guard is a second statement because under READ COMMITTED it then reads with
    a snapshot taken after the lock was granted, so it sees every holding committed by the transactions
    that held the lock before; a subquery in the locking statement itself would not (PostgreSQL
    re-checks a locked row's own columns, not a subquery's rows)."""
    params = {
        "allocation_id": allocation_id,
        "resource": resource,
        "node_id": node_id,
        "pool_id": pool_id,
        "amount": n,
        "starts_at": start,
        "ends_at": end,
    }
    if (await conn.execute(LOCK_SCALAR, params)).first() is None:
        return False
    row = (await conn.execute(HOLD_SCALAR, params)).first()
    return row is not None
