"""Hard requirement 11 (docs/fleet.md): a target is rejected when it "has nodes with too few CPUs for the
whole-rank layout when declared (otherwise ceil(cpus / nodes)), or too little memory per node, or does
not record that number when the request needs it"."""

from __future__ import annotations

from app.fleet.documents import FleetTarget, PlacementRequestDoc
from app.fleet.requirements.context import Context, per_node_shortfall

NAME = "node_shape"
RULE = (
    "has nodes with too few CPUs for the whole-rank layout when declared (otherwise ceil(cpus / nodes)), "
    "or too little memory per node, or does not record that number when the request needs it"
)


def _layout(request: PlacementRequestDoc) -> str:
    if request.mpi_ranks is not None and request.threads_per_rank is not None:
        return f"{request.mpi_ranks} ranks x {request.threads_per_rank} threads on {request.nodes} node(s)"
    return f"{request.cpus} CPUs on {request.nodes} node(s)"


def check(target: FleetTarget, request: PlacementRequestDoc, ctx: Context) -> list[str]:
    """``request.cpus_per_node`` against ``node.cpus`` (always), ``mem_mb_per_node`` against
    ``node.mem_mb`` (when requested); an unknown figure the request needs rejects."""
    node = target.node
    cpus, mem_mb = (node.cpus, node.mem_mb) if node else (None, None)
    reasons = per_node_shortfall(
        NAME, request.cpus_per_node, cpus, f"CPUs per node ({_layout(request)})", "node CPUs unknown"
    )
    memory = "MB of memory per node"
    return reasons + per_node_shortfall(
        NAME, request.mem_mb_per_node, mem_mb, memory, "node memory unknown", " MB"
    )
