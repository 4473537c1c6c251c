"""Commit a signed plan (docs/api.md, "Plan tokens"): a create with ``ifPlan`` books exactly the
token's nodes, atoms, window and amounts through the guarded commit
(:func:`app.capacity.commit.single.commit_placements`, with the create's quota charge and placed mark),
or answers 412 PLAN_STALE naming what changed; it never plans again, nor anywhere else.

After a lost race the node is locked ``FOR UPDATE`` (:class:`~app.capacity.placing.inline.NodeHold`):
the commits that beat this one hold ``FOR SHARE`` on it until they commit, so the state read next
(:func:`what_changed`) sees what they booked, and the answer names the atom and the reason. The caller's
transaction rolls back on the error: no reservation row, allocation or quota charge is left.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.commit.lost_races import LostRace
from app.capacity.commit.shapes import CommitExtras
from app.capacity.placing.inline import NodeHold, Placed, commit_assumed
from app.capacity.planning.snapshot import PoolCache
from app.capacity.reservations.plan_tokens import PlanClaim, PlannedNode
from app.db.locks import PoolShare
from app.db.tables import device_bookings, devices, nodes, pools
from app.db.windows import window
from app.errors import PlanStale
from app.observability.metrics import PLAN_TOKEN_CREATES
from app.placement.model import PlacementRequest

ATTEMPT = 1  # one guarded commit: SAVEPOINT capacity_place_1


async def commit_plan(
    conn: AsyncConnection,
    cache: PoolCache,
    request: PlacementRequest,
    claim: PlanClaim,
    reservation_id: str,
    extras: CommitExtras,
    pool_share: PoolShare,
) -> Placed:
    """Commit ``claim``'s plan for ``request`` (its window the claim's) in the caller's transaction,
    taking the pool's ``FOR SHARE`` first (``pool_share``). Returns :class:`Placed`; raises PlanStale
    (a lost race, or the pool archived) and QuotaExceeded (``extras.charge`` refused)."""
    placements = tuple(n.candidate() for n in claim.nodes)
    outcome = await commit_assumed(
        conn, cache, request, placements, reservation_id, ATTEMPT, extras, pool_share
    )
    if outcome is None:
        archived = f"pool {request.pool_id} was archived"
        raise stale(archived, claim.nodes[0], [archived])
    if isinstance(outcome, LostRace):
        planned = claim.node(outcome.node_id) or claim.nodes[0]
        changes = await what_changed(conn, request, planned, outcome)
        raise stale("; ".join(changes), planned, changes)
    PLAN_TOKEN_CREATES.labels("placed").inc()
    return outcome


def stale(message: str, planned: PlannedNode, changes: Sequence[str]) -> PlanStale:
    """412 PLAN_STALE naming what changed on ``planned``'s node, counted as a ``stale`` create."""
    PLAN_TOKEN_CREATES.labels("stale").inc()
    details = {"nodeId": planned.node_id, "nodeName": planned.node_name, "changes": list(changes)}
    return PlanStale(message, details)


_NODE = sa.bindparam("node_id", type_=sa.Text)
_ATOMS = sa.bindparam("atoms", type_=pg.ARRAY(sa.Text))
_DURING = sa.bindparam("during", type_=device_bookings.c.during.type)
# SELECT n.name, n.cordoned, n.ready, n.heartbeat_lost, n.no_schedule_reasons,
#        p.archived_at IS NOT NULL AS archived
#   FROM nodes n JOIN pools p ON p.id = n.pool_id WHERE n.id = :node_id
NODE_NOW = (
    sa.select(
        nodes.c.name,
        nodes.c.cordoned,
        nodes.c.ready,
        nodes.c.heartbeat_lost,
        nodes.c.no_schedule_reasons,
        pools.c.archived_at.is_not(None).label("archived"),
    )
    .select_from(nodes.join(pools, pools.c.id == nodes.c.pool_id))
    .where(nodes.c.id == _NODE, nodes.c.deleted_at.is_(None))  # a deleted node was removed
)
# SELECT d.id, d.node_id, d.healthy, d.bookable,
#        EXISTS (SELECT 1 FROM device_bookings b WHERE b.device_pk = d.pk AND b.during && :during) AS booked
#   FROM devices d WHERE d.id = ANY(:atoms) AND d.deleted_at IS NULL   -- a deleted node's ids are history
ATOMS_NOW = sa.select(
    devices.c.id,
    devices.c.node_id,
    devices.c.healthy,
    devices.c.bookable,
    sa.exists()
    .where(device_bookings.c.device_pk == devices.c.pk, device_bookings.c.during.op("&&")(_DURING))
    .label("booked"),
).where(devices.c.id == sa.any_(_ATOMS), devices.c.deleted_at.is_(None))


async def what_changed(
    conn: AsyncConnection, request: PlacementRequest, planned: PlannedNode, lost: LostRace
) -> list[str]:
    """What changed on ``planned``'s node since the plan was signed, read after the lost race ``lost``
    with the node held ``FOR UPDATE`` (so the winners have committed): the node removed or its pool
    archived, its cordon and conditions, NoSchedule reasons it did not have, and per planned atom
    ``<atoms> on <node> was booked by another reservation``, turned unhealthy, is no longer bookable,
    or left the node. ``lost.reason`` when none of these shows (a label the request needs went away,
    a scalar ran out)."""
    assert request.start is not None and request.end is not None
    hold = NodeHold()
    await hold.take(conn, planned.node_id)  # waits for the commits that hold the node FOR SHARE
    node = (await conn.execute(NODE_NOW, {"node_id": planned.node_id})).first()
    if node is None:
        return [f"{planned.node_name} was removed from the pool"]
    name = node.name
    changes: list[str] = []
    if node.archived:
        changes.append(f"pool {request.pool_id} was archived")
    changes += _state_changes(name, planned, node)
    params = {"atoms": list(_booked(planned)), "during": window(request.start, request.end)}
    atoms = {row.id: row for row in (await conn.execute(ATOMS_NOW, params)).all()}
    changes += _atom_changes(name, planned, atoms)
    return changes or [lost.reason]


def _booked(planned: PlannedNode) -> tuple[str, ...]:
    return (*(a for group in planned.atoms_by_request for a in group), *planned.held_atoms)


def _state_changes(name: str, planned: PlannedNode, node: Any) -> list[str]:
    """The node's cordon, conditions and NoSchedule reasons, against what the plan read."""
    changes: list[str] = []
    if node.cordoned and not planned.cordoned:
        changes.append(f"{name} was cordoned")
    if not node.ready and planned.ready:
        changes.append(f"{name} is no longer ready")
    if node.heartbeat_lost and not planned.heartbeat_lost:
        changes.append(f"{name} lost its agent's heartbeat")
    if not changes:  # a taint (or a dedication) the node did not have
        added = [r for r in node.no_schedule_reasons or () if r not in planned.reasons]
        if added:
            changes.append(f"{name} has new NoSchedule reasons: {', '.join(added)}")
    return changes


def _atom_changes(name: str, planned: PlannedNode, atoms: dict[str, Any]) -> list[str]:
    """Per planned atom: booked in the window by another reservation, unhealthy, unbookable, or gone."""
    booked: list[str] = []
    changes: list[str] = []
    for atom in _booked(planned):
        row = atoms.get(atom)
        if row is None or row.node_id != planned.node_id:
            changes.append(f"{atom} left {name}")
        elif row.booked:
            booked.append(atom)
        elif atom in planned.held_atoms:  # a whole-node lease's: unhealthy or unbookable when planned
            continue
        elif not row.healthy:
            changes.append(f"{atom} on {name} turned unhealthy")
        elif not row.bookable:
            changes.append(f"{atom} on {name} is no longer bookable")
    if booked:
        verb = "was" if len(booked) == 1 else "were"
        changes.insert(0, f"{', '.join(booked)} on {name} {verb} booked by another reservation")
    return changes
