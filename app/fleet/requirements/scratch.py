"""Hard requirement 12 (docs/explain.md): a target is rejected when it "has too little scratch per node, or
unknown scratch capacity when scratch_mb_per_node is requested". Nodes never combine their scratch."""

from __future__ import annotations

from app.fleet.documents import FleetTarget, PlacementRequestDoc
from app.fleet.requirements.context import Context, per_node_shortfall

NAME = "scratch"
RULE = "has too little scratch per node, or unknown scratch capacity when scratch_mb_per_node is requested"


def check(target: FleetTarget, request: PlacementRequestDoc, ctx: Context) -> list[str]:
    """``request.scratch_mb_per_node`` against ``node.scratch_mb`` (MB; 0 = none, None = unknown)."""
    scratch = target.node.scratch_mb if target.node else None
    need = request.scratch_mb_per_node
    return per_node_shortfall(NAME, need, scratch, "MB per node", "node scratch unknown", " MB")
