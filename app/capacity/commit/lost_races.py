"""The lost-race vocabulary shared by both guarded commits (the single-node one in
:mod:`app.capacity.commit.single` and the batch's): :class:`LostRace`, the four reason kinds in their
order (the ``reason`` label of ``bc_lost_races_total``, which the metrics import from here),
:data:`LOST_RACE_SQLSTATES`, the guard checks that turn a short answer into a lost race with its reason
text (:func:`node_lost`, :func:`atoms_lost`, :func:`scalars_lost`, :func:`bookings_lost`,
:func:`holdings_lost`, :func:`atom_booked`, :func:`booked_concurrently`), and the pending text once
every attempt lost (:func:`unschedulable_after`). docs/architecture.md lists the commit room."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import DBAPIError

from app.db.tx import sqlstate
from app.placement.model import Candidate, PlacementRequest
from app.placement.system_labels import unmet_label

NOT_SCHEDULABLE = "not_schedulable"
ATOM_UNHEALTHY = "atom_unhealthy"
ATOM_BOOKED = "atom_booked"
SCALAR_RAN_OUT = "scalar_ran_out"
LOST_RACE_KINDS = (NOT_SCHEDULABLE, ATOM_UNHEALTHY, ATOM_BOOKED, SCALAR_RAN_OUT)


def unschedulable_after(reasons: Sequence[str]) -> str:
    """The pending reason once every attempt of a placement lost a race: ``Unschedulable after <n>
    conflicting attempts: <reason>; <reason>; ...`` with one lost-race reason per attempt, in attempt
    order. The one home of this text, used by the inline placer and the batch."""
    return f"Unschedulable after {len(reasons)} conflicting attempts: {'; '.join(reasons)}"


LOST_RACE_SQLSTATES = frozenset({"40P01", "23P01"})  # deadlock detected, exclusion violation


@dataclass(frozen=True, slots=True)
class LostRace:
    """The commit lost a race; ``reason`` is one of docs/placement-rules.md's four texts (naming the node),
    ``kind`` its
    bounded class, one of :data:`LOST_RACE_KINDS` (the ``reason`` label of ``bc_lost_races_total``)."""

    node_id: str
    reason: str
    kind: str


def not_schedulable(node_id: str, node_name: str) -> LostRace:
    """The lost race ``<node> is no longer schedulable`` (kind ``not_schedulable``)."""
    return LostRace(node_id, f"{node_name} is no longer schedulable", NOT_SCHEDULABLE)


def atom_unhealthy(node_id: str, node_name: str) -> LostRace:
    """The lost race ``an atom on <node> turned unhealthy or unbookable`` (kind ``atom_unhealthy``)."""
    return LostRace(node_id, f"an atom on {node_name} turned unhealthy or unbookable", ATOM_UNHEALTHY)


def scalar_ran_out(node_id: str, node_name: str, resource: str) -> LostRace:
    """The lost race ``<resource> on <node> ran out`` (kind ``scalar_ran_out``)."""
    return LostRace(node_id, f"{resource} on {node_name} ran out", SCALAR_RAN_OUT)


def atom_booked(node_id: str, node_name: str) -> LostRace:
    """The lost race ``an atom on <node> was booked concurrently`` (kind ``atom_booked``)."""
    return LostRace(node_id, f"an atom on {node_name} was booked concurrently", ATOM_BOOKED)


def booked_concurrently(exc: DBAPIError, node_id: str, node_name: str) -> LostRace:
    """A guarded statement on the node failed on a lock (a deadlock or a lock conflict,
    :data:`LOST_RACE_SQLSTATES`): the race for its atoms was lost (:func:`atom_booked`). Any other
    error is raised again."""
    if sqlstate(exc) not in LOST_RACE_SQLSTATES:
        raise exc
    return atom_booked(node_id, node_name)


def labels_hold(wanted: Mapping[str, str], have: Mapping[str, tuple[str, str]]) -> bool:
    """Do the node's labels (key -> (value, source)) satisfy ``wanted`` (``'*'`` = any value)? The one
    labels rule, :func:`app.placement.system_labels.unmet_label`, found nothing unmet."""
    held = [(k, have[k]) for k in wanted if k in have]
    return unmet_label(wanted.items(), {k: v for k, (v, _) in held}, {k: s for k, (_, s) in held}) is None


def node_lost(locked: Any, request: PlacementRequest, candidate: Candidate) -> LostRace | None:
    """Guard 1: ``SELECT n.id FROM nodes n JOIN pools p ... WHERE n.id = :node AND <schedulable> FOR
    SHARE OF n`` found no row, or the node's labels (re-read under that lock) no longer satisfy the
    request's nodeLabels: ``<node> is no longer schedulable``."""
    still = locked.node == 1
    if still and request.node_labels:
        have = {k: (v, s) for k, v, s in (locked.labels or ())}
        still = labels_hold(request.node_labels, have)
    if still:
        return None
    return not_schedulable(candidate.node_id, candidate.node_name)


def atoms_lost(locked: Any, candidate: Candidate) -> LostRace | None:
    """Guard 2: ``SELECT id, class FROM devices WHERE id = ANY(:atoms) AND node_id = :node AND healthy
    AND bookable ORDER BY id FOR SHARE`` found fewer rows than atoms: ``an atom on <node> turned
    unhealthy or unbookable``."""
    if len(locked.atom_classes or ()) == len(candidate.atoms):
        return None
    return atom_unhealthy(candidate.node_id, candidate.node_name)


def scalars_lost(locked: Any, candidate: Candidate) -> LostRace | None:
    """Guard 3: ``SELECT resource FROM node_resources WHERE node_id = :node AND resource = ANY(:scalars)
    ORDER BY resource FOR UPDATE`` found fewer rows than requested resources (the node has no such
    resource any more): ``<resource> on <node> ran out``, naming the first in sorted order."""
    if locked.scalars == len(candidate.resources):
        return None
    first = sorted(candidate.resources)[0]
    return scalar_ran_out(candidate.node_id, candidate.node_name, first)


def bookings_lost(written: Any, candidate: Candidate) -> LostRace | None:
    """Write 6: ``INSERT INTO device_bookings ... ON CONFLICT DO NOTHING RETURNING device_id`` returned
    fewer rows than atoms booked (the picked ones and a lease's held ones): ``an atom on <node> was
    booked concurrently``."""
    if written.booked == len(candidate.booked_atoms):
        return None
    return atom_booked(candidate.node_id, candidate.node_name)


def holdings_lost(written: Any, candidate: Candidate) -> LostRace | None:
    """Write 7: ``INSERT INTO scalar_holdings ... WHERE peak + n <= floor(allocatable * ratio)
    RETURNING resource`` left a resource out: ``<resource> on <node> ran out`` (the first in sorted
    order)."""
    held = set(written.held or ())
    missing = [r for r in sorted(candidate.resources) if r not in held]
    if not missing:
        return None
    return scalar_ran_out(candidate.node_id, candidate.node_name, missing[0])
