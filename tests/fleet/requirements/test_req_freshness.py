"""Hard requirement `freshness`: its table, run alone and through the whole explanation.

docs/explain.md, "Hard requirements and their reasons": a target is rejected when it "was observed longer
ago than --max-age (default 300 s), or more than
60 s in the future (clock skew)".
"""

from __future__ import annotations

from typing import Any

import pytest

from app.fleet.requirements import freshness as requirement
from tests.fleet.requirements.tables import DROP, check_case, lane, request

CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    # --- freshness: max age (default 300 s, equality fits) and clock skew (more than 60 s ahead)
    ("age equals max age", lane(observed_at="2026-10-12T11:55:00+00:00"), request(), []),
    (
        "stale",
        lane(observed_at="2026-10-12T11:54:59+00:00"),
        request(),
        ["freshness: observed 301 s ago, older than the max age of 300 s"],
    ),
    ("60 s in the future", lane(observed_at="2026-10-12T12:01:00+00:00"), request(), []),
    (
        "61 s in the future",
        lane(observed_at="2026-10-12T12:01:01+00:00"),
        request(),
        ["freshness: observed 61 s in the future, beyond the 60 s clock-skew allowance"],
    ),
    ("other offset, same instant", lane(observed_at="2026-10-12T13:59:00+02:00"), request(), []),
    ("observation time unknown", lane(observed_at=DROP), request(), ["freshness: observation time unknown"]),
]


@pytest.mark.parametrize(("target", "req", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_freshness(target: dict[str, Any], req: dict[str, Any], expected: list[str]) -> None:
    check_case(requirement, target, req, expected)
