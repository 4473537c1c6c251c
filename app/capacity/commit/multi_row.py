"""The multi-row guarded commit: every plan of one batch attempt committed with a few statements
(:mod:`app.capacity.commit.multi_row_statements`) in one SAVEPOINT, with the lost-race texts of
:mod:`app.capacity.commit.lost_races` that the single-node commit uses too
(docs/placement-rules.md, "The guarded commit"; docs/scaling.md).

Steps, in the lock order pools -> nodes -> devices -> node_resources (:mod:`app.db.locks`; the caller
holds the pool row ``FOR SHARE``): lock the planned nodes still schedulable for each plan's tenant, check
the labels a plan asks for, lock the atoms still healthy and bookable, write the allocations and the
bookings (fewer bookings back: the plan lost the race), lock the ``node_resources`` rows and hold the
scalars, each window's holds guarded with their total. A losing plan's rows are deleted; the others stay.
A deadlock or exclusion violation (40P01, 23P01: the same lost race) rolls the attempt back to its
savepoint and commits the plans one by one with :func:`app.capacity.commit.single.commit_placements`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.commit.lost_races import (
    ATOM_BOOKED,
    ATOM_UNHEALTHY,
    LOST_RACE_SQLSTATES,
    NOT_SCHEDULABLE,
    SCALAR_RAN_OUT,
    LostRace,
    atom_booked,
    atom_unhealthy,
    labels_hold,
    not_schedulable,
    scalar_ran_out,
)
from app.capacity.commit.multi_row_statements import (
    HOLD_SCALAR,
    HOLD_SCALARS,
    INSERT_ALLOCATION,
    INSERT_BOOKINGS,
    TOLERATED_SEPARATOR,
    lock_atoms_statement,
    lock_scalars_statement,
    lock_tenant_nodes_statement,
)
from app.capacity.commit.shapes import Committed
from app.capacity.commit.single import commit_placements
from app.capacity.predicates import tolerated_reasons
from app.db.tables import allocations, device_bookings, node_labels, scalar_holdings
from app.db.tx import sqlstate
from app.db.windows import window, windows_apart
from app.ids import new_id
from app.placement.model import Candidate, PlacementRequest


@dataclass(frozen=True, slots=True)
class PlannedRow:
    """One plan to commit: the reservation, its request (a window set: ``start`` and ``end``) and the
    candidate picked for it."""

    reservation_id: str
    request: PlacementRequest
    candidate: Candidate


@dataclass(slots=True)
class _Attempt:
    """One attempt's multi-row commit as its steps share it: the connection, the pool, whether a lock
    held elsewhere is lost rather than waited for, the allocation id of each plan still alive
    (reservation id -> id) and the races lost so far (reservation id -> :class:`LostRace`)."""

    conn: AsyncConnection
    pool_id: str
    skip_locked: bool
    ids: dict[str, str] = field(default_factory=dict)
    lost: dict[str, LostRace] = field(default_factory=dict)


async def commit_rows(
    conn: AsyncConnection, pool_id: str, planned: Sequence[PlannedRow], attempt: int
) -> dict[str, Committed | LostRace]:
    """Commit every plan of one attempt with multi-row guarded statements inside
    ``SAVEPOINT capacity_batch_<attempt>``; reservation id -> :class:`Committed` or :class:`LostRace`."""
    if not planned:
        return {}
    savepoint = f"capacity_batch_{int(attempt)}"
    await conn.exec_driver_sql(f"SAVEPOINT {savepoint}")
    try:
        results = await _guarded_rows(conn, pool_id, planned, skip_locked=attempt > 1)
    except DBAPIError as exc:
        if sqlstate(exc) not in LOST_RACE_SQLSTATES:
            raise
        await conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {savepoint}")
        await conn.exec_driver_sql(f"RELEASE SAVEPOINT {savepoint}")
        return await _commit_one_by_one(conn, planned, attempt)
    await conn.exec_driver_sql(f"RELEASE SAVEPOINT {savepoint}")
    return results


async def _commit_one_by_one(
    conn: AsyncConnection, planned: Sequence[PlannedRow], attempt: int
) -> dict[str, Committed | LostRace]:
    """The fallback after a deadlock: each plan with the single-placement guarded commit."""
    out: dict[str, Committed | LostRace] = {}
    for p in planned:
        r = p.request
        assert r.start is not None and r.end is not None
        result = await commit_placements(conn, r, (p.candidate,), p.reservation_id, attempt, r.start, r.end)
        out[p.reservation_id] = result if isinstance(result, LostRace) else result[0]
    return out


async def _guarded_rows(
    conn: AsyncConnection, pool_id: str, planned: Sequence[PlannedRow], skip_locked: bool
) -> dict[str, Committed | LostRace]:
    """The multi-row commit. ``skip_locked`` (attempts after the first, when this transaction already
    holds the bookings of the batch's winners): a node, atom or ``node_resources`` row another
    transaction holds in a conflicting mode (or waits for) is not waited for but lost, so the
    transaction never waits for a lock while it holds bookings (that would invert the lock order)."""
    a = _Attempt(conn, pool_id, skip_locked)
    await _check_nodes(a, planned)
    await _check_labels(a, planned)
    classes = await _check_atoms(a, planned)
    alive = [p for p in planned if p.reservation_id not in a.lost]
    a.ids = {p.reservation_id: new_id("alloc") for p in alive}
    await _insert_allocations(a, alive)
    await _insert_bookings(a, alive)
    await _hold_scalars(a, alive)
    await delete_allocations(conn, [a.ids[r] for r in a.lost if r in a.ids])
    out: dict[str, Committed | LostRace] = dict(a.lost)
    for p in alive:
        rid = p.reservation_id
        if rid not in a.lost:
            c = p.candidate
            out[rid] = Committed(
                a.ids[rid], c.node_id, tuple(c.atoms), dict(c.resources), classes.get(rid, {})
            )
    return out


async def _check_nodes(a: _Attempt, planned: Sequence[PlannedRow]) -> None:
    """Lock the planned nodes that are still schedulable for their entries' tenants, every tenant's in
    one statement (:func:`lock_tenant_nodes_statement`); an entry whose (node, tenant) is not among
    them lost the race."""
    pairs = sorted({(p.candidate.node_id, p.request.tenant_id) for p in planned})
    if not pairs:
        return
    params = {
        "node_ids": [n for n, _ in pairs],
        "tenant_ids": [t for _, t in pairs],
        "tolerated": [TOLERATED_SEPARATOR.join(tolerated_reasons(t)) for _, t in pairs],
        "pool_id": a.pool_id,
    }
    rows = (await lock_tenant_nodes_statement(a.skip_locked).run(a.conn, params)).all()
    still = {(r[0], r[1]) for r in rows}
    for p in planned:
        if (p.candidate.node_id, p.request.tenant_id) not in still:
            a.lost[p.reservation_id] = _lost(p, NOT_SCHEDULABLE)


async def _check_labels(a: _Attempt, planned: Sequence[PlannedRow]) -> None:
    """The locked nodes' labels again, for the entries that ask for labels (one statement)."""
    asking = [p for p in planned if p.request.node_labels and p.reservation_id not in a.lost]
    if not asking:
        return
    keys = sorted({k for p in asking for k in p.request.node_labels})
    # SELECT node_id, key, value, source FROM node_labels WHERE node_id = ANY(:nodes) AND key = ANY(:keys)
    have: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)
    for r in (
        await a.conn.execute(
            sa.select(
                node_labels.c.node_id, node_labels.c.key, node_labels.c.value, node_labels.c.source
            ).where(
                node_labels.c.node_id.in_(sorted({p.candidate.node_id for p in asking})),
                node_labels.c.key.in_(keys),
            )
        )
    ).all():
        have[r.node_id][r.key] = (r.value, r.source)
    for p in asking:
        if not labels_hold(p.request.node_labels, have.get(p.candidate.node_id, {})):
            a.lost[p.reservation_id] = _lost(p, NOT_SCHEDULABLE)


async def _check_atoms(a: _Attempt, planned: Sequence[PlannedRow]) -> dict[str, dict[str, Decimal]]:
    """Lock the picked atoms that are still healthy and bookable (one statement); returns reservation
    id -> atoms per device class for the entries whose atoms all are."""
    alive = [p for p in planned if p.reservation_id not in a.lost and p.candidate.atoms]
    if not alive:
        return {}
    atom_ids = sorted({atom for p in alive for atom in p.candidate.atoms})
    rows = (await lock_atoms_statement(a.skip_locked).run(a.conn, {"atom_ids": atom_ids})).all()
    ok = {r[0]: (r[1], r[2]) for r in rows}
    classes: dict[str, dict[str, Decimal]] = {}
    for p in alive:
        found = [ok.get(atom) for atom in p.candidate.atoms]
        if any(f is None or f[1] != p.candidate.node_id for f in found):
            a.lost[p.reservation_id] = _lost(p, ATOM_UNHEALTHY)
            continue
        counts: dict[str, Decimal] = defaultdict(Decimal)
        for f in found:
            assert f is not None
            counts[f[0]] += 1
        classes[p.reservation_id] = dict(counts)
    return classes


async def _insert_allocations(a: _Attempt, alive: Sequence[PlannedRow]) -> None:
    """One multi-row INSERT of the allocations (the bookings and holdings refer to them)."""
    if not alive:
        return
    # INSERT INTO allocations (id, reservation_id, pool_id, node_id, atoms, resources, during)
    #   VALUES (:id, :reservation_id, ...)     -- one statement compiled once, the rows sent as one batch
    await a.conn.execute(
        INSERT_ALLOCATION,
        [
            {
                "id": a.ids[p.reservation_id],
                "reservation_id": p.reservation_id,
                "pool_id": a.pool_id,
                "node_id": p.candidate.node_id,
                "atoms": list(p.candidate.atoms),
                "resources": {k: str(v) for k, v in p.candidate.resources.items()},
                "during": _during(p),
            }
            for p in alive
        ],
    )


async def _insert_bookings(a: _Attempt, alive: Sequence[PlannedRow]) -> None:
    """One multi-row INSERT of every atom's booking (a whole-node lease's held atoms too,
    ``Candidate.booked_atoms``); an entry with fewer rows back lost the race."""
    rows = [
        (atom, a.ids[p.reservation_id], p.request.start, p.request.end)
        for p in alive
        if p.reservation_id not in a.lost
        for atom in p.candidate.booked_atoms
    ]
    if not rows:
        return
    atom_ids, allocation_ids, starts, ends = (list(c) for c in zip(*rows, strict=True))
    params = {
        "atom_ids": atom_ids,
        "ids": allocation_ids,
        "starts": starts,
        "ends": ends,
        "pool_id": a.pool_id,
    }
    # <INSERT_BOOKINGS>: ON CONFLICT DO NOTHING RETURNING allocation_id (fewer rows: booked meanwhile)
    booked: dict[str, int] = defaultdict(int)
    for (allocation_id,) in (await INSERT_BOOKINGS.run(a.conn, params)).all():
        booked[allocation_id] += 1
    for p in alive:
        rid = p.reservation_id
        if rid not in a.lost and booked[a.ids[rid]] != len(p.candidate.booked_atoms):
            a.lost[rid] = _lost(p, ATOM_BOOKED)


async def _hold_scalars(a: _Attempt, alive: Sequence[PlannedRow]) -> None:
    """Each scalar of the surviving entries with the guarded hold of :mod:`app.capacity.commit.single`
    (``node_resources`` row lock, then the peak guard), in (node, resource) order:

    1. one statement locks every ``node_resources`` row (:func:`lock_scalars_statement`); an entry whose
       row is missing (or, skipping locked rows, held elsewhere) lost the race;
    2. one statement (:data:`HOLD_SCALARS`) holds every (node, resource) whose holds' windows are
       equal or apart, each row guarded with the total of its window: a window's holds fit whole or not
       at all;
    3. the (node, resource) pairs that did not fit whole, and those with windows that overlap in part,
       one hold at a time (:data:`HOLD_SCALAR`,
       under the locks of step 1), so each hold sees the earlier ones: the first that no longer fit
       lose."""
    holds = sorted(
        (p.candidate.node_id, resource, p.reservation_id, Decimal(n), p)
        for p in alive
        if p.reservation_id not in a.lost
        for resource, n in p.candidate.resources.items()
    )
    if not holds:
        return
    keys = sorted({(h[0], h[1]) for h in holds})
    params = {"node_ids": [k[0] for k in keys], "resources": [k[1] for k in keys]}
    # SELECT node_id, resource FROM node_resources WHERE (node_id, resource) IN (...)
    #  ORDER BY node_id, resource FOR UPDATE [SKIP LOCKED]
    locked = {(r[0], r[1]) for r in (await lock_scalars_statement(a.skip_locked).run(a.conn, params)).all()}
    groups: dict[tuple[str, str], list[tuple[str, Decimal, PlannedRow]]] = defaultdict(list)
    for node_id, resource, rid, _n, p in holds:
        if (node_id, resource) not in locked:
            if rid not in a.lost:
                a.lost[rid] = _lost(p, SCALAR_RAN_OUT, resource)
    for node_id, resource, rid, n, p in holds:
        if rid not in a.lost:
            groups[(node_id, resource)].append((rid, n, p))
    totals: dict[tuple[str, str, Any, Any], Decimal] = defaultdict(Decimal)
    for (node_id, resource), group in groups.items():
        for _rid, n, p in group:
            totals[(node_id, resource, p.request.start, p.request.end)] += n
    apart = {  # (node, resource) whose windows are equal or apart: one guard per window is exact
        key for key in groups if windows_apart(k for k in totals if (k[0], k[1]) == key)
    }
    rows = [
        (a.ids[rid], resource, node_id, n, r.start, r.end, totals[(node_id, resource, r.start, r.end)])
        for (node_id, resource), group in groups.items()
        if (node_id, resource) in apart
        for rid, n, p in group
        for r in (p.request,)
    ]
    held: set[tuple[str, str]] = set()
    if rows:
        columns = [list(c) for c in zip(*rows, strict=True)]
        names = ("ids", "resources", "node_ids", "amounts", "starts", "ends", "totals")
        # <HOLD_SCALARS>: INSERT ... SELECT FROM unnest(...) WHERE peak + group total <= cap RETURNING
        written = await HOLD_SCALARS.run(
            a.conn, {**dict(zip(names, columns, strict=True)), "pool_id": a.pool_id}
        )
        held = {(r[0], r[1]) for r in written.all()}
    for (node_id, resource), group in sorted(groups.items()):
        if all((a.ids[rid], resource) in held for rid, _, _ in group if rid not in a.lost):
            continue
        for rid, n, p in group:  # one at a time: the first that no longer fit lose
            if rid in a.lost or (a.ids[rid], resource) in held:
                continue
            r = p.request
            one = {
                "allocation_id": a.ids[rid],
                "resource": resource,
                "node_id": node_id,
                "pool_id": a.pool_id,
                "amount": n,
                "starts_at": r.start,
                "ends_at": r.end,
            }
            # INSERT INTO scalar_holdings ... WHERE <peak> + :amount <= floor(allocatable * ratio) RETURNING
            if (await a.conn.execute(HOLD_SCALAR, one)).first() is None:
                a.lost[rid] = _lost(p, SCALAR_RAN_OUT, resource)


async def delete_allocations(conn: AsyncConnection, allocation_ids: Iterable[str]) -> None:
    """Remove what the losing entries wrote (their scalar holdings, bookings and allocations)."""
    ids = sorted(allocation_ids)
    if not ids:
        return
    # DELETE FROM scalar_holdings WHERE allocation_id = ANY(:ids);
    # DELETE FROM device_bookings WHERE allocation_id = ANY(:ids);
    # DELETE FROM allocations WHERE id = ANY(:ids)
    await conn.execute(sa.delete(scalar_holdings).where(scalar_holdings.c.allocation_id.in_(ids)))
    await conn.execute(sa.delete(device_bookings).where(device_bookings.c.allocation_id.in_(ids)))
    await conn.execute(sa.delete(allocations).where(allocations.c.id.in_(ids)))


def _during(p: PlannedRow) -> Any:
    r = p.request
    assert r.start is not None and r.end is not None
    return window(r.start, r.end)


def _lost(p: PlannedRow, kind: str, resource: str | None = None) -> LostRace:
    """The lost race of ``kind`` on the planned node, with the texts of
    :mod:`app.capacity.commit.lost_races` (``resource`` names what ran out)."""
    c = p.candidate
    if kind == NOT_SCHEDULABLE:
        return not_schedulable(c.node_id, c.node_name)
    if kind == ATOM_UNHEALTHY:
        return atom_unhealthy(c.node_id, c.node_name)
    if kind == ATOM_BOOKED:
        return atom_booked(c.node_id, c.node_name)
    assert kind == SCALAR_RAN_OUT and resource is not None
    return scalar_ran_out(c.node_id, c.node_name, resource)
