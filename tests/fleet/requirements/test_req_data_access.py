"""Hard requirement `data_access`: its table, run alone and through the whole explanation.

docs/explain.md, "Hard requirements and their reasons": a target is rejected when it "lacks any required
data-access label, or its data access is unknown".
"""

from __future__ import annotations

from typing import Any

import pytest

from app.fleet.requirements import data_access as requirement
from tests.fleet.requirements.tables import DROP, check_case, lane, request

CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    # --- data access
    ("data access lacking", lane(data_access=["results"]), request(), ["data_access: lacks shared-inputs"]),
    (
        "data access unknown",
        lane(data_access=DROP),
        request(),
        ["data_access: unknown, want shared-inputs, results"],
    ),
    (
        "data access none recorded",
        lane(data_access=[]),
        request(),
        ["data_access: lacks shared-inputs, results"],
    ),
    ("data access empty requirement", lane(data_access=DROP), request(required_data_access=[]), []),
]


@pytest.mark.parametrize(("target", "req", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_data_access(target: dict[str, Any], req: dict[str, Any], expected: list[str]) -> None:
    check_case(requirement, target, req, expected)
