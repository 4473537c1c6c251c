"""Hard requirement 15 (docs/explain.md): a target is rejected when it "would exceed either its own walltime
limit or the job's requested wall_time_seconds at the upper end of the predicted execution time":
``runtime_seconds.high / speed_factor`` against both, exactly (equality fits). Without a runtime
estimate there is nothing to check."""

from __future__ import annotations

from app.fleet.documents import FleetTarget, PlacementRequestDoc
from app.fleet.figures import exceeds, num_text
from app.fleet.requirements.context import Context, reason

NAME = "execution_bound"
RULE = (
    "would exceed either its own walltime limit or the job's requested wall_time_seconds at the upper end of "
    "the predicted execution time"
)


def check(target: FleetTarget, request: PlacementRequestDoc, ctx: Context) -> list[str]:
    """One reason per bound exceeded: the target's limit first, then the requested walltime."""
    if request.runtime_seconds is None:
        return []
    high, speed = request.runtime_seconds.high, target.speed_factor
    exceeded = []
    limit = target.max_walltime_seconds
    if not target.walltime_unlimited and limit is not None and exceeds(high, speed, limit):
        exceeded.append(f"the walltime limit of {limit} s")
    if request.wall_time_seconds is not None and exceeds(high, speed, request.wall_time_seconds):
        exceeded.append(f"the requested walltime of {request.wall_time_seconds} s")
    shown = f"up to {num_text(high / speed)} s ({num_text(high)} s at speed {num_text(speed)})"
    return [reason(NAME, f"{shown} exceeds {what}") for what in exceeded]
