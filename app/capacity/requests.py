"""From a reservation body to what capacity plans and charges: :func:`placement_request`,
:func:`quota_amounts`, :func:`spec_hash` (idempotent retries) and :func:`check_start` (the window's
start against the database clock; raises InvalidInput). Pure functions, no I/O; docs/lifecycle.md.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from app.capacity.config import MAX_LEAD, START_SKEW, CapacityConfig
from app.errors import InvalidInput
from app.placement.model import PlacementRequest
from app.placement.request import ReservationRequest, to_placement_request


def placement_request(
    config: CapacityConfig,
    body: ReservationRequest,
    now: datetime,
    node_labels: Mapping[str, str] | None = None,
) -> PlacementRequest:
    """The capacity port's entry point from a reservation body to a PlacementRequest: a module's
    ``node_labels`` plus capacity's requiredCapabilities under ``config`` (create, preview, and the
    re-place / repair paths all build their request here)."""
    return to_placement_request(
        body, now, enforce_device_limits=config.enforce_device_limits, node_labels=node_labels
    )


def spec_hash(spec: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a reservation spec (idempotent retries compare it)."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def row_values(body: ReservationRequest, spec: Mapping[str, Any], digest: str) -> dict[str, Any]:
    """The columns of a new reservation row from its body (every insert path: the inline create, the
    queue's enqueue, the bulk create), the id left to the caller: tenant, pool, the stored ``spec`` and
    its ``digest`` (:func:`spec_hash`), the idempotency key and the deadline."""
    return {
        "tenant_id": body.tenantId,
        "pool_id": body.poolId,
        "spec": spec,
        "spec_hash": digest,
        "idempotency_key": body.idempotencyKey,
        "deadline": body.deadline,
    }


def quota_amounts(request: PlacementRequest) -> dict[str, Decimal]:
    """What a request charges: atoms per device class and scalar amounts, times gang members."""
    members = request.gang.members if request.gang else 1
    amounts: dict[str, Decimal] = defaultdict(Decimal)
    for d in request.devices:
        amounts[d.device_class] += Decimal(d.count * members)
    for name, n in request.resources.items():
        amounts[name] += Decimal(n) * members
    return dict(amounts)


def check_start(body: ReservationRequest, now: datetime, max_lead: timedelta = MAX_LEAD) -> None:
    """Raise InvalidInput (path ``start``) for a window that starts in the past (more than 60 s behind
    the database clock, to allow for client clock skew) or more than ``max_lead`` ahead of it, and
    (path ``deadline``) for a deadline at or before the database clock: such a reservation could never
    be placed (docs/lifecycle.md, "Deadlines")."""
    if body.deadline is not None and body.deadline <= now:
        raise InvalidInput(
            f"deadline {body.deadline.isoformat()} has passed (now {now.isoformat()})", path="deadline"
        )
    start = body.fixed_start
    if start is None:
        return
    if start < now - START_SKEW:
        raise InvalidInput(f"start {start.isoformat()} is in the past (now {now.isoformat()})", path="start")
    if start > now + max_lead:
        raise InvalidInput(
            f"start {start.isoformat()} is more than {max_lead.days} days ahead "
            f"(now {now.isoformat()}, at most {(now + max_lead).isoformat()})",
            path="start",
        )
