"""The one home of a reservation's conditions made by the capacity service (docs/architecture.md, "Reservation
lifecycle"): ``{type, status: "True", reason, message}``. ``Unschedulable`` (its reasons, and how a newer
one replaces the one before), ``Ended`` (``WindowEnded``, ``WindowPassed``) and ``Released``
(``ReleaseRequested``) are made here;
``Scheduled`` by the wake (:mod:`app.capacity.controllers.wake`) and ``Repaired`` by BookingRepair
(:mod:`app.capacity.controllers.repair`) carry fields of their own.

``{type: Unschedulable, status: "True", reason, message}``, ``reason`` being ``NoFit`` (nothing fits: the
message is the pending summary of :mod:`app.placement.summary`, or the lost races of the placer) or
``QuotaExceeded`` (it fits, but the tenant's quota does not hold now). A reservation carries at most one;
a newer one replaces it, and a placement turns it ``False`` (:mod:`app.capacity.controllers.wake`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

UNSCHEDULABLE = "Unschedulable"
NO_FIT = "NoFit"
QUOTA_EXCEEDED = "QuotaExceeded"
ENDED = "Ended"
WINDOW_ENDED = "WindowEnded"
WINDOW_PASSED = "WindowPassed"
RELEASED = "Released"
RELEASE_REQUESTED = "ReleaseRequested"


def condition(kind: str, reason: str, message: str) -> dict[str, Any]:
    """``{type: kind, status: "True", reason, message}``."""
    return {"type": kind, "status": "True", "reason": reason, "message": message}


def unschedulable_condition(reason: str, message: str) -> dict[str, Any]:
    """``{type: Unschedulable, status: "True", reason, message}``."""
    return condition(UNSCHEDULABLE, reason, message)


def no_fit_conditions(message: str) -> list[dict[str, Any]]:
    """The conditions of a request stored ``pending``: one Unschedulable condition, reason ``NoFit``,
    with ``message`` (the planner's reason text)."""
    return [unschedulable_condition(NO_FIT, message)]


def ended_condition(end: datetime) -> dict[str, Any]:
    """The condition of a placed reservation whose window is over."""
    return condition(ENDED, WINDOW_ENDED, f"the window ended at {end.isoformat()}")


def window_passed_condition(start: datetime) -> dict[str, Any]:
    """The condition of a pending reservation whose explicit start passed before it could be placed."""
    return condition(
        ENDED, WINDOW_PASSED, f"the start {start.isoformat()} passed while the reservation was pending"
    )


def released_condition(at: datetime, status_before: str) -> dict[str, Any]:
    """The condition of a reservation released by ``POST /v1/reservations/{id}/release`` at ``at`` (the
    database clock), while it was ``status_before`` (placed, pending or queued); docs/lifecycle.md."""
    return {
        **condition(RELEASED, RELEASE_REQUESTED, f"released at {at.isoformat()} while {status_before}"),
        "at": at.isoformat(),
    }


def with_unschedulable(
    conditions: Iterable[dict[str, Any]], reason: str, message: str
) -> list[dict[str, Any]]:
    """``conditions`` with their Unschedulable condition replaced by this one (last)."""
    kept = [c for c in conditions if c.get("type") != UNSCHEDULABLE]
    return [*kept, unschedulable_condition(reason, message)]
