"""Hard requirement `scratch`: its table, run alone and through the whole explanation.

docs/explain.md, "Hard requirements and their reasons": a target is rejected when it "has too little
scratch per node, or unknown scratch capacity when
scratch_mb_per_node is requested".
"""

from __future__ import annotations

from typing import Any

import pytest

from app.fleet.requirements import scratch as requirement
from tests.fleet.requirements.tables import DROP, check_case, lane, node, request

CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    # --- scratch per node (nodes never combine)
    (
        "too little scratch",
        lane(node=node(scratch_mb=50000)),
        request(),
        ["scratch: needs 100000 MB per node, node has 50000 MB"],
    ),
    (
        "zero scratch",
        lane(node=node(scratch_mb=0)),
        request(),
        ["scratch: needs 100000 MB per node, node has 0 MB"],
    ),
    (
        "scratch is per node",
        lane(node=node(scratch_mb=60000)),
        request(nodes=2, cpus=16, mpi_ranks=2, threads_per_rank=8),
        ["scratch: needs 100000 MB per node, node has 60000 MB"],
    ),
    (
        "scratch unknown",
        lane(node=node(scratch_mb=DROP)),
        request(),
        ["scratch: needs 100000 MB per node, node scratch unknown"],
    ),
    ("scratch not requested", lane(node=node(scratch_mb=DROP)), request(scratch_mb_per_node=DROP), []),
]


@pytest.mark.parametrize(("target", "req", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_scratch(target: dict[str, Any], req: dict[str, Any], expected: list[str]) -> None:
    check_case(requirement, target, req, expected)
