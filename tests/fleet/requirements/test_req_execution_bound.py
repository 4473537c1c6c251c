"""Hard requirement `execution_bound`: its table, run alone and through the whole explanation.

docs/explain.md, "Hard requirements and their reasons": a target is rejected when it "would exceed either
its own walltime limit or the job's requested
wall_time_seconds at the upper end of the predicted execution time".
"""

from __future__ import annotations

from typing import Any

import pytest

from app.fleet.requirements import execution_bound as requirement
from tests.fleet.requirements.tables import DROP, check_case, daemon, lane, request

CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    # --- execution upper bound / speed against both limits (equality fits)
    (
        "execution equals requested walltime",
        lane(speed_factor=0.5, speed_source="declared"),
        request(runtime_seconds={"low": 6000, "high": 8400}, wall_time_seconds=16800),
        [],
    ),
    (
        "execution over requested walltime",
        lane(speed_factor=0.5, speed_source="declared"),
        request(runtime_seconds={"low": 6000, "high": 8400}, wall_time_seconds=16799),
        ["execution_bound: up to 16800 s (8400 s at speed 0.5) exceeds the requested walltime of 16799 s"],
    ),
    (
        "execution equality with a decimal speed",
        lane(speed_factor=0.7, speed_source="declared"),
        request(runtime_seconds={"low": 5, "high": 7}, wall_time_seconds=10),
        [],
    ),
    (
        "slow target cannot finish within the requested limit",
        daemon(speed_factor=0.25, speed_source="benchmark"),
        request(wall_time_seconds=14400),
        ["execution_bound: up to 33600 s (8400 s at speed 0.25) exceeds the requested walltime of 14400 s"],
    ),
    (
        "execution over the target's limit",
        lane(max_walltime_seconds=172800),
        request(wall_time_seconds=DROP, runtime_seconds={"low": 100000, "high": 400000}),
        ["execution_bound: up to 200000 s (400000 s at speed 2) exceeds the walltime limit of 172800 s"],
    ),
    (
        "execution at the target's limit",
        lane(max_walltime_seconds=172800),
        request(wall_time_seconds=DROP, runtime_seconds={"low": 100000, "high": 345600}),
        [],
    ),
    (
        "execution over both limits",
        lane(max_walltime_seconds=3600),
        request(wall_time_seconds=3600, runtime_seconds={"low": 8000, "high": 8000}),
        [
            "execution_bound: up to 4000 s (8000 s at speed 2) exceeds the walltime limit of 3600 s",
            "execution_bound: up to 4000 s (8000 s at speed 2) exceeds the requested walltime of 3600 s",
        ],
    ),
]


@pytest.mark.parametrize(("target", "req", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_execution_bound(target: dict[str, Any], req: dict[str, Any], expected: list[str]) -> None:
    check_case(requirement, target, req, expected)
