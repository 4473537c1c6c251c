"""Hard requirement `node_shape`: its table, run alone and through the whole explanation.

docs/explain.md, "Hard requirements and their reasons": a target is rejected when it "has nodes with too
few CPUs for the whole-rank layout when declared
(otherwise ceil(cpus / nodes)), or too little memory per node, or does not record that number when the request
needs it".
"""

from __future__ import annotations

from typing import Any

import pytest

from app.fleet.requirements import node_shape as requirement
from tests.fleet.requirements.tables import DROP, check_case, lane, node, request

CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    # --- CPUs: the worked example of docs/explain.md, three 8-thread ranks on two nodes
    (
        "whole-rank layout, 12-CPU lane",
        lane(node=node(cpus=12)),
        request(cpus=24, nodes=2, mpi_ranks=3, threads_per_rank=8),
        ["node_shape: needs 16 CPUs per node (3 ranks x 8 threads on 2 node(s)), node has 12"],
    ),
    (
        "whole-rank layout, 16-CPU lane",
        lane(node=node(cpus=16)),
        request(cpus=24, nodes=2, mpi_ranks=3, threads_per_rank=8),
        [],
    ),
    (
        "no layout: ceil(cpus / nodes) fits 12",
        lane(node=node(cpus=12)),
        request(cpus=24, nodes=2, mpi_ranks=DROP, threads_per_rank=DROP),
        [],
    ),
    (
        "no layout: ceil(25 / 2) = 13",
        lane(node=node(cpus=12)),
        request(cpus=25, nodes=2, mpi_ranks=DROP, threads_per_rank=DROP),
        ["node_shape: needs 13 CPUs per node (25 CPUs on 2 node(s)), node has 12"],
    ),
    (
        "node CPUs unknown",
        lane(node=node(cpus=DROP)),
        request(),
        ["node_shape: needs 16 CPUs per node (2 ranks x 8 threads on 1 node(s)), node CPUs unknown"],
    ),
    (
        "no node record",
        lane(node=DROP),
        request(scratch_mb_per_node=DROP),
        [
            "node_shape: needs 16 CPUs per node (2 ranks x 8 threads on 1 node(s)), node CPUs unknown",
            "node_shape: needs 64000 MB of memory per node, node memory unknown",
        ],
    ),
    # --- memory per node
    (
        "too little memory",
        lane(node=node(mem_mb=32000)),
        request(),
        ["node_shape: needs 64000 MB of memory per node, node has 32000 MB"],
    ),
    ("memory equal", lane(node=node(mem_mb=64000)), request(), []),
    (
        "memory unknown",
        lane(node=node(mem_mb=DROP)),
        request(),
        ["node_shape: needs 64000 MB of memory per node, node memory unknown"],
    ),
    ("memory not requested", lane(node=node(mem_mb=DROP)), request(mem_mb_per_node=DROP), []),
]


@pytest.mark.parametrize(("target", "req", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_node_shape(target: dict[str, Any], req: dict[str, Any], expected: list[str]) -> None:
    check_case(requirement, target, req, expected)
