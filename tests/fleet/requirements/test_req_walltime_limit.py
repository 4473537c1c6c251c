"""Hard requirement `walltime_limit`: its table, run alone and through the whole explanation.

docs/explain.md, "Hard requirements and their reasons": a target is rejected when it "cannot accept the
explicit wall_time_seconds request, or has no known
walltime limit and no positive evidence of unlimited walltime".
"""

from __future__ import annotations

from typing import Any

import pytest

from app.fleet.requirements import walltime_limit as requirement
from tests.fleet.requirements.tables import DROP, check_case, daemon, lane, request

CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    # --- walltime limit
    ("walltime at the limit", lane(max_walltime_seconds=172800), request(wall_time_seconds=172800), []),
    (
        "walltime over the limit",
        lane(max_walltime_seconds=172800),
        request(wall_time_seconds=172801),
        ["walltime_limit: requests 172801 s, over the limit of 172800 s"],
    ),
    (
        "fast estimate does not admit an oversized request",
        lane(max_walltime_seconds=3600),
        request(wall_time_seconds=7200, runtime_seconds={"low": 60, "high": 120}),
        ["walltime_limit: requests 7200 s, over the limit of 3600 s"],
    ),
    (
        "walltime limit unknown",
        lane(max_walltime_seconds=DROP),
        request(),
        ["walltime_limit: unknown and not recorded as unlimited"],
    ),
    (
        "walltime limit unknown, no request",
        lane(max_walltime_seconds=DROP),
        request(wall_time_seconds=DROP),
        ["walltime_limit: unknown and not recorded as unlimited"],
    ),
    ("walltime unlimited", daemon(), request(wall_time_seconds=10_000_000, runtime_seconds=DROP), []),
    ("walltime checked without runtime", lane(), request(runtime_seconds=DROP, wall_time_seconds=172800), []),
    (
        "walltime checked without runtime, over",
        lane(),
        request(runtime_seconds=DROP, wall_time_seconds=172900),
        ["walltime_limit: requests 172900 s, over the limit of 172800 s"],
    ),
]


@pytest.mark.parametrize(("target", "req", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_walltime_limit(target: dict[str, Any], req: dict[str, Any], expected: list[str]) -> None:
    check_case(requirement, target, req, expected)
