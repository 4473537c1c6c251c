"""Hard requirement 10 (docs/explain.md): a target is rejected when it "needs more nodes than one job may have
there". A daemon host is one node; a lane without a recorded max_nodes admits a one-node job only."""

from __future__ import annotations

from app.fleet.documents import FleetTarget, PlacementRequestDoc
from app.fleet.requirements.context import Context, reason

NAME = "nodes"
RULE = "needs more nodes than one job may have there"


def check(target: FleetTarget, request: PlacementRequestDoc, ctx: Context) -> list[str]:
    """``request.nodes`` against ``target.job_max_nodes`` (unknown rejects a multi-node job)."""
    if request.nodes == 1:
        return []
    limit = target.job_max_nodes
    if limit is None:
        return [reason(NAME, f"needs {request.nodes}, per-job node limit unknown")]
    if request.nodes > limit:
        return [reason(NAME, f"needs {request.nodes}, a job may have at most {limit}")]
    return []
