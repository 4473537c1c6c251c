"""Hard requirement 1 (docs/explain.md): a target is rejected when it "was unreachable or in maintenance when
observed". Unknown reachability rejects too (unknown essential capability is never a fallback)."""

from __future__ import annotations

from app.fleet.documents import FleetTarget, PlacementRequestDoc
from app.fleet.requirements.context import Context, reason

NAME = "availability"
RULE = "was unreachable or in maintenance when observed"


def check(target: FleetTarget, request: PlacementRequestDoc, ctx: Context) -> list[str]:
    """Every availability reason: reachability unknown or false, and maintenance, each its own text."""
    reasons = []
    if target.reachable is None:
        reasons.append(reason(NAME, "reachability unknown"))
    elif not target.reachable:
        reasons.append(reason(NAME, "unreachable when observed"))
    if target.maintenance:
        reasons.append(reason(NAME, "in maintenance when observed"))
    return reasons
