"""Hard requirement 13 (docs/explain.md): a target is rejected when it "has too few GPUs per node, or an
unknown
GPU count, when gpus_per_node is requested"."""

from __future__ import annotations

from app.fleet.documents import FleetTarget, PlacementRequestDoc
from app.fleet.requirements.context import Context, per_node_shortfall

NAME = "gpus"
RULE = "has too few GPUs per node, or an unknown GPU count, when gpus_per_node is requested"


def check(target: FleetTarget, request: PlacementRequestDoc, ctx: Context) -> list[str]:
    """``request.gpus_per_node`` against ``node.gpus`` (whole GPUs; None = unknown)."""
    gpus = target.node.gpus if target.node else None
    return per_node_shortfall(NAME, request.gpus_per_node, gpus, "per node", "node GPU count unknown")
