"""Hard requirement `licenses`: its table, run alone and through the whole explanation.

docs/explain.md, "Hard requirements and their reasons": a target is rejected when it "lacks any required
license-eligibility label, or its license
eligibility is unknown".
"""

from __future__ import annotations

from typing import Any

import pytest

from app.fleet.requirements import licenses as requirement
from tests.fleet.requirements.tables import DROP, check_case, lane, request

CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    # --- licenses
    (
        "license lacking",
        lane(licenses=["solver-base"]),
        request(required_licenses=["solver-base", "solver-gradients"]),
        ["licenses: lacks solver-gradients"],
    ),
    (
        "licenses unknown",
        lane(licenses=DROP),
        request(required_licenses=["solver-base"]),
        ["licenses: unknown, want solver-base"],
    ),
    ("licenses held", lane(), request(required_licenses=["solver-base", "solver-gradients"]), []),
    ("licenses not required", lane(licenses=DROP), request(), []),
]


@pytest.mark.parametrize(("target", "req", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_licenses(target: dict[str, Any], req: dict[str, Any], expected: list[str]) -> None:
    check_case(requirement, target, req, expected)
