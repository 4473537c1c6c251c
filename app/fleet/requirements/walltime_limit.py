"""Hard requirement 14 (docs/explain.md): a target is rejected when it "cannot accept the explicit
wall_time_seconds request, or has no known walltime limit and no positive evidence of unlimited
walltime". Checked with or without a runtime estimate; equality fits."""

from __future__ import annotations

from app.fleet.documents import FleetTarget, PlacementRequestDoc
from app.fleet.requirements.context import Context, reason

NAME = "walltime_limit"
RULE = (
    "cannot accept the explicit wall_time_seconds request, or has no known walltime limit and no positive "
    "evidence of unlimited walltime"
)


def check(target: FleetTarget, request: PlacementRequestDoc, ctx: Context) -> list[str]:
    """``request.wall_time_seconds`` against ``max_walltime_seconds``; ``walltime_unlimited`` admits any."""
    if target.walltime_unlimited:
        return []
    limit = target.max_walltime_seconds
    if limit is None:
        return [reason(NAME, "unknown and not recorded as unlimited")]
    if request.wall_time_seconds is not None and request.wall_time_seconds > limit:
        return [reason(NAME, f"requests {request.wall_time_seconds} s, over the limit of {limit} s")]
    return []
