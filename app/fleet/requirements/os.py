"""Hard requirement 4 (docs/explain.md): a target is rejected when it "has a different or unknown operating
system when os is requested" (an exact, case-sensitive match)."""

from __future__ import annotations

from app.fleet.documents import FleetTarget, PlacementRequestDoc
from app.fleet.requirements.context import Context, reason

NAME = "os"
RULE = "has a different or unknown operating system when os is requested"


def check(target: FleetTarget, request: PlacementRequestDoc, ctx: Context) -> list[str]:
    """``target.os == request.os`` exactly; nothing to check when the request names no os."""
    if request.os is None or target.os == request.os:
        return []
    return [reason(NAME, f"{target.os or 'unknown'}, want {request.os}")]
