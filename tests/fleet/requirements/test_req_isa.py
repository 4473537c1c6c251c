"""Hard requirement `isa`: its table, run alone and through the whole explanation.

docs/explain.md, "Hard requirements and their reasons": a target is rejected when it "has another
architecture, or does not support the requested ISA
level".
"""

from __future__ import annotations

from typing import Any

import pytest

from app.fleet.requirements import isa as requirement
from tests.fleet.requirements.tables import DROP, check_case, lane, request

CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    # --- architecture and ISA level
    (
        "other architecture",
        lane(arch="aarch64", isa_levels=["armv8.2-a"]),
        request(),
        [
            "isa: arch aarch64 cannot run x86-64-v4 (x86_64)",
            "isa: x86-64-v4 not supported (supports armv8.2-a)",
        ],
    ),
    (
        "other architecture, level listed",
        lane(arch="aarch64"),
        request(),
        ["isa: arch aarch64 cannot run x86-64-v4 (x86_64)"],
    ),
    ("arch alias amd64", lane(arch="amd64"), request(), []),
    ("arch unknown, level listed", lane(arch=DROP), request(), []),
    (
        "ISA level unsupported",
        lane(isa_levels=["x86-64-v2", "x86-64-v3"]),
        request(),
        ["isa: x86-64-v4 not supported (supports x86-64-v2, x86-64-v3)"],
    ),
    (
        "ISA levels unknown",
        lane(isa_levels=DROP),
        request(),
        ["isa: supported ISA levels unknown, want x86-64-v4"],
    ),
    ("ISA not requested", lane(isa_levels=DROP, arch="aarch64"), request(isa_level=DROP), []),
]


@pytest.mark.parametrize(("target", "req", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_isa(target: dict[str, Any], req: dict[str, Any], expected: list[str]) -> None:
    check_case(requirement, target, req, expected)
