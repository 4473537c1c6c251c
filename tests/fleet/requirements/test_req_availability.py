"""Hard requirement `availability`: its table, run alone and through the whole explanation.

docs/explain.md, "Hard requirements and their reasons": a target is rejected when it "was unreachable or in
maintenance when observed".
"""

from __future__ import annotations

from typing import Any

import pytest

from app.fleet.requirements import availability as requirement
from tests.fleet.requirements.tables import DROP, check_case, daemon, lane, request

CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    # --- unreachable or in maintenance when observed
    ("reachable", lane(reachable=True), request(), []),
    ("unreachable", lane(reachable=False), request(), ["availability: unreachable when observed"]),
    ("reachability unknown", lane(reachable=DROP), request(), ["availability: reachability unknown"]),
    ("maintenance", lane(maintenance=True), request(), ["availability: in maintenance when observed"]),
    (
        "unreachable and in maintenance",
        daemon(reachable=False, maintenance=True),
        request(),
        ["availability: unreachable when observed", "availability: in maintenance when observed"],
    ),
]


@pytest.mark.parametrize(("target", "req", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_availability(target: dict[str, Any], req: dict[str, Any], expected: list[str]) -> None:
    check_case(requirement, target, req, expected)
