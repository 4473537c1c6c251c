"""The one home of a reservation's conditions made by the capacity service (docs/architecture.md, "Reservation
lifecycle"): each is a :class:`~app.answers.reservations.Condition`, ``{type, status: "True", reason,
message}`` plus the fields of its kind. ``Unschedulable`` (its reasons, and how a newer one replaces the
one before), ``Ended`` (``WindowEnded``, ``WindowPassed``, ``DeadlinePassed``), ``Released``
(``ReleaseRequested``), ``Extended`` (``ExtendRequested``: a placed reservation's longer window,
docs/lifecycle.md "Extend") and ``Planned`` (``PlannedStart``: a pending reservation's planned window,
docs/lifecycle.md "Planned starts") are made here; ``Scheduled`` by the wake
(:mod:`app.capacity.controllers.wake`), ``Repaired`` by BookingRepair
(:mod:`app.capacity.controllers.repair`) and ``Preempted`` by spot preemption
(:mod:`app.capacity.placing.preemption`) carry fields of their own.

``{type: Unschedulable, status: "True", reason, message}``, ``reason`` being ``NoFit`` (nothing fits: the
message is the pending summary of :mod:`app.placement.summary`, or the lost races of the placer) or
``QuotaExceeded`` (it fits, but the tenant's quota does not hold now). A reservation carries at most one;
a newer one replaces it, and a placement turns it ``False`` (:mod:`app.capacity.controllers.wake`).

Stored form: ``reservations.conditions`` holds the list as JSON objects with the fields each condition
was made with (:func:`stored`; a Repaired condition's ``newNodeId: null`` is kept, absent fields stay
absent), read back by :func:`from_stored`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from app.answers.reservations import Condition, NearestMiss, RejectionRow
from app.placement.why_not import WhyNot

UNSCHEDULABLE = "Unschedulable"
NO_FIT = "NoFit"
QUOTA_EXCEEDED = "QuotaExceeded"
ENDED = "Ended"
WINDOW_ENDED = "WindowEnded"
WINDOW_PASSED = "WindowPassed"
DEADLINE_PASSED = "DeadlinePassed"
RELEASED = "Released"
RELEASE_REQUESTED = "ReleaseRequested"
PLANNED = "Planned"
PLANNED_START = "PlannedStart"
EXTENDED = "Extended"
EXTEND_REQUESTED = "ExtendRequested"


def condition(kind: str, reason: str, message: str, **fields: Any) -> Condition:
    """``{type: kind, status: "True", reason, message, **fields}`` (``fields``: the kind's own, e.g.
    ``at``; only those given are set, and shown)."""
    return Condition(type=kind, status="True", reason=reason, message=message, **fields)


def stored(conditions: Iterable[Condition]) -> list[dict[str, Any]]:
    """``conditions`` as ``reservations.conditions`` stores them: JSON objects of the fields set."""
    return [c.model_dump(exclude_unset=True) for c in conditions]


def from_stored(conditions: Iterable[dict[str, Any]] | None) -> list[Condition]:
    """The conditions of a ``reservations.conditions`` value (None: none)."""
    return [Condition.model_validate(c) for c in conditions or ()]


def appended(conditions: Iterable[dict[str, Any]] | None, *new: Condition) -> list[dict[str, Any]]:
    """A stored ``reservations.conditions`` value with ``new`` added last, in stored form."""
    return [*(conditions or ()), *stored(new)]


def unschedulable_condition(reason: str, message: str, why: WhyNot | None = None) -> Condition:
    """``{type: Unschedulable, status: "True", reason, message}``, with the rejection rows and nearest
    misses of ``why`` when given (:func:`why_not_fields`)."""
    return condition(UNSCHEDULABLE, reason, message, **why_not_fields(why))


def no_fit_conditions(message: str, why: WhyNot | None = None) -> list[Condition]:
    """The conditions of a request stored ``pending``: one Unschedulable condition, reason ``NoFit``,
    with ``message`` (the planner's reason text) and, given the plan's ``why`` (docs/reasons.md), its
    rejection rows and nearest misses."""
    return [unschedulable_condition(NO_FIT, message, why)]


def why_not_fields(why: WhyNot | None) -> dict[str, Any]:
    """``{rejections, nearestMisses}`` as a preview and an Unschedulable condition answer them (nothing
    when ``why`` is None)."""
    if why is None:
        return {}
    return {
        "rejections": [
            RejectionRow(filter=r.filter, reason=r.reason, count=r.count, nodes=list(r.nodes))
            for r in why.rows
        ],
        "nearestMisses": [
            NearestMiss(
                nodeId=m.node_id,
                nodeName=m.node_name,
                filter=m.filter,
                reason=m.reason,
                shortfall=m.shortfall,
                missingAtoms=m.missing_atoms,
            )
            for m in why.nearest
        ],
    }


def quota_exceeded_conditions(message: str) -> list[Condition]:
    """The conditions of a request that fits but whose charge the tenant's quota refused: one
    Unschedulable condition, reason ``QuotaExceeded``, with ``message`` (the refusal's)."""
    return [unschedulable_condition(QUOTA_EXCEEDED, message)]


def ended_condition(end: datetime) -> Condition:
    """The condition of a placed reservation whose window is over."""
    return condition(ENDED, WINDOW_ENDED, f"the window ended at {end.isoformat()}")


def window_passed_condition(start: datetime) -> Condition:
    """The condition of a pending reservation whose explicit start passed before it could be placed."""
    return condition(
        ENDED, WINDOW_PASSED, f"the start {start.isoformat()} passed while the reservation was pending"
    )


def deadline_passed_condition(deadline: datetime, status_before: str) -> Condition:
    """The condition of a reservation still ``status_before`` (pending or queued) at its ``deadline``
    (docs/lifecycle.md, "Deadlines")."""
    return condition(
        ENDED,
        DEADLINE_PASSED,
        f"the deadline {deadline.isoformat()} passed while the reservation was {status_before}",
    )


def released_condition(at: datetime, status_before: str) -> Condition:
    """The condition of a reservation released by ``POST /v1/reservations/{id}/release`` at ``at`` (the
    database clock), while it was ``status_before`` (placed, pending or queued); docs/lifecycle.md."""
    return condition(
        RELEASED, RELEASE_REQUESTED, f"released at {at.isoformat()} while {status_before}", at=at.isoformat()
    )


def extended_condition(at: datetime, old_end: datetime, new_end: datetime) -> Condition:
    """The condition of a placed reservation extended by ``POST /v1/reservations/{id}/extend`` at ``at``
    (the database clock) from ``old_end`` to ``new_end`` (docs/lifecycle.md, "Extend")."""
    return condition(
        EXTENDED,
        EXTEND_REQUESTED,
        f"extended from {old_end.isoformat()} to {new_end.isoformat()}",
        at=at.isoformat(),
        oldEnd=old_end.isoformat(),
        newEnd=new_end.isoformat(),
    )


def with_unschedulable(
    conditions: Iterable[Condition], reason: str, message: str, why: WhyNot | None = None
) -> list[Condition]:
    """``conditions`` with their Unschedulable condition replaced by this one (last)."""
    kept = [c for c in conditions if c.type != UNSCHEDULABLE]
    return [*kept, unschedulable_condition(reason, message, why)]


def planned_condition(start: datetime, end: datetime, node_id: str, node_name: str) -> Condition:
    """The condition of a pending reservation given a planned window ``[start, end)`` on the node
    (docs/lifecycle.md, "Planned starts"): ``at`` is the planned start, ``nodeId`` the node."""
    window = f"[{start.isoformat()}, {end.isoformat()})"
    return condition(
        PLANNED, PLANNED_START, f"planned for {window} on {node_name}", at=start.isoformat(), nodeId=node_id
    )


def without_planned(conditions: Iterable[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """A stored ``reservations.conditions`` value without its ``Planned`` condition (a plan dropped or
    turned into a placement)."""
    return [c for c in conditions or () if c.get("type") != PLANNED]
