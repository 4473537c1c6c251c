"""Hard requirement 11 (docs/fleet.md): a target is rejected when it "has nodes with too few CPUs for the
whole-rank layout when declared (otherwise ceil(cpus / nodes)), or too little memory per node, or does
not record that number when the request needs it"."""

from __future__ import annotations

from app.fleet.documents import FleetTarget, PlacementRequestDoc
from app.fleet.requirements.context import Context, reason

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
    reasons = []
    need = f"needs {request.cpus_per_node} CPUs per node ({_layout(request)})"
    cpus = node.cpus if node else None
    if cpus is None:
        reasons.append(reason(NAME, f"{need}, node CPUs unknown"))
    elif cpus < request.cpus_per_node:
        reasons.append(reason(NAME, f"{need}, node has {cpus}"))
    if request.mem_mb_per_node is not None:
        mem = node.mem_mb if node else None
        need = f"needs {request.mem_mb_per_node} MB of memory per node"
        if mem is None:
            reasons.append(reason(NAME, f"{need}, node memory unknown"))
        elif mem < request.mem_mb_per_node:
            reasons.append(reason(NAME, f"{need}, node has {mem} MB"))
    return reasons
