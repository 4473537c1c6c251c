"""Hard requirement 7 (docs/explain.md): a target is rejected when it "is a daemon host, or has a different or
unknown queue/partition, when queue is requested". A matching target name is no evidence."""

from __future__ import annotations

from app.fleet.documents import FleetTarget, PlacementRequestDoc
from app.fleet.requirements.context import Context, reason

NAME = "queue"
RULE = "is a daemon host, or has a different or unknown queue/partition, when queue is requested"


def check(target: FleetTarget, request: PlacementRequestDoc, ctx: Context) -> list[str]:
    """``target.queue == request.queue`` exactly, on a scheduler lane only."""
    if request.queue is None:
        return []
    if target.kind == "daemon":
        return [reason(NAME, f"a daemon host has no queue, want {request.queue}")]
    if target.queue is None:
        return [reason(NAME, f"unknown, want {request.queue}")]
    if target.queue != request.queue:
        return [reason(NAME, f"{target.queue}, want {request.queue}")]
    return []
