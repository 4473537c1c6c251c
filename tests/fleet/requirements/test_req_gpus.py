"""Hard requirement `gpus`: its table, run alone and through the whole explanation.

docs/explain.md, "Hard requirements and their reasons": a target is rejected when it "has too few GPUs per
node, or an unknown GPU count, when gpus_per_node
is requested".
"""

from __future__ import annotations

from typing import Any

import pytest

from app.fleet.requirements import gpus as requirement
from tests.fleet.requirements.tables import DROP, check_case, lane, node, request

CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    # --- GPUs per node
    (
        "too few GPUs",
        lane(node=node(gpus=0)),
        request(gpus_per_node=2),
        ["gpus: needs 2 per node, node has 0"],
    ),
    ("GPUs fit", lane(node=node(gpus=2)), request(gpus_per_node=2), []),
    (
        "GPU count unknown",
        lane(node=node(gpus=DROP)),
        request(gpus_per_node=1),
        ["gpus: needs 1 per node, node GPU count unknown"],
    ),
    ("GPUs not requested", lane(node=node(gpus=DROP)), request(), []),
]


@pytest.mark.parametrize(("target", "req", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_gpus(target: dict[str, Any], req: dict[str, Any], expected: list[str]) -> None:
    check_case(requirement, target, req, expected)
