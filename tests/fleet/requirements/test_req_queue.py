"""Hard requirement `queue`: its table, run alone and through the whole explanation.

docs/explain.md, "Hard requirements and their reasons": a target is rejected when it "is a daemon host, or
has a different or unknown queue/partition, when
queue is requested".
"""

from __future__ import annotations

from typing import Any

import pytest

from app.fleet.requirements import queue as requirement
from tests.fleet.requirements.tables import DROP, check_case, daemon, lane, request

CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    # --- queue / partition
    ("queue matches", lane(), request(queue="compute"), []),
    ("queue differs", lane(queue="debug"), request(queue="compute"), ["queue: debug, want compute"]),
    (
        "queue unknown, name matches",
        lane(name="compute", queue=DROP),
        request(queue="compute"),
        ["queue: unknown, want compute"],
    ),
    (
        "daemon with queue requested",
        daemon(),
        request(queue="compute"),
        ["queue: a daemon host has no queue, want compute"],
    ),
    ("queue not requested", lane(queue=DROP), request(queue=None), []),
]


@pytest.mark.parametrize(("target", "req", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_queue(target: dict[str, Any], req: dict[str, Any], expected: list[str]) -> None:
    check_case(requirement, target, req, expected)
