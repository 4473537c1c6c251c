"""NoSchedule reasons of a node (docs/reasons.md, 1): kept in ``nodes.no_schedule_reasons`` in the
same transaction as their cause, in this order: ``cordoned``, ``draining``, ``not ready``, ``heartbeat
lost``, then ``tainted <key>=<value>`` for each NoSchedule / NoExecute taint sorted by key and value.
``draining`` is made in :mod:`app.placement.schedulable` (the lease rule reads it) and placed here."""

from __future__ import annotations

from collections.abc import Iterable

from app.placement.schedulable import DRAINING, taint_reason

NO_SCHEDULE_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def no_schedule_reasons(
    cordoned: bool,
    ready: bool,
    heartbeat_lost: bool,
    taints: Iterable[tuple[str, str, str]],
    *,
    draining: bool,
) -> list[str]:
    """The reasons for a node with these conditions and ``(key, value, effect)`` taints; ``draining``
    is the node's drain (docs/operating.md, "Maintenance: drain and delete")."""
    reasons: list[str] = []
    if cordoned:
        reasons.append("cordoned")
    if draining:
        reasons.append(DRAINING)
    if not ready:
        reasons.append("not ready")
    if heartbeat_lost:
        reasons.append("heartbeat lost")
    tainted = sorted({(k, v) for k, v, effect in taints if effect in NO_SCHEDULE_EFFECTS})
    reasons.extend(taint_reason(k, v) for k, v in tainted)
    return reasons
