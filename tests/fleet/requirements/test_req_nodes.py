"""Hard requirement `nodes`: its table, run alone and through the whole explanation.

docs/explain.md, "Hard requirements and their reasons": a target is rejected when it "needs more nodes than
one job may have there".
"""

from __future__ import annotations

from typing import Any

import pytest

from app.fleet.requirements import nodes as requirement
from tests.fleet.requirements.tables import DROP, check_case, daemon, lane, request

CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    # --- nodes per job
    (
        "too many nodes",
        lane(max_nodes=2),
        request(nodes=4, cpus=64, mpi_ranks=8, threads_per_rank=8, mem_mb_per_node=1000),
        ["nodes: needs 4, a job may have at most 2"],
    ),
    ("nodes at the limit", lane(max_nodes=4), request(nodes=4, cpus=64, mpi_ranks=8, threads_per_rank=8), []),
    (
        "node limit unknown",
        lane(max_nodes=DROP),
        request(nodes=2, cpus=32, mpi_ranks=4, threads_per_rank=8),
        ["nodes: needs 2, per-job node limit unknown"],
    ),
    ("one node, limit unknown", lane(max_nodes=DROP), request(), []),
    (
        "daemon is one node",
        daemon(),
        request(nodes=2, cpus=16, mpi_ranks=2, threads_per_rank=8),
        ["nodes: needs 2, a job may have at most 1"],
    ),
]


@pytest.mark.parametrize(("target", "req", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_nodes(target: dict[str, Any], req: dict[str, Any], expected: list[str]) -> None:
    check_case(requirement, target, req, expected)
