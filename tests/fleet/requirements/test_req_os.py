"""Hard requirement `os`: its table, run alone and through the whole explanation.

docs/explain.md, "Hard requirements and their reasons": a target is rejected when it "has a different or
unknown operating system when os is requested".
"""

from __future__ import annotations

from typing import Any

import pytest

from app.fleet.requirements import os as requirement
from tests.fleet.requirements.tables import DROP, check_case, lane, request

CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    # --- operating system (exact, case-sensitive)
    ("os differs", lane(os="Darwin"), request(), ["os: Darwin, want Linux"]),
    ("os case differs", lane(os="linux"), request(), ["os: linux, want Linux"]),
    ("os unknown", lane(os=DROP), request(), ["os: unknown, want Linux"]),
    ("os not requested", lane(os=DROP), request(os=DROP), []),
]


@pytest.mark.parametrize(("target", "req", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_os(target: dict[str, Any], req: dict[str, Any], expected: list[str]) -> None:
    check_case(requirement, target, req, expected)
