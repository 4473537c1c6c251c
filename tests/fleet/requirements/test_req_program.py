"""Hard requirement `program`: its table, run alone and through the whole explanation.

docs/explain.md, "Hard requirements and their reasons": a target is rejected when it "lacks the program, or
the requested runtime digest".
"""

from __future__ import annotations

from typing import Any

import pytest

from app.fleet.requirements import program as requirement
from tests.fleet.requirements.tables import DIGEST, DROP, OTHER_DIGEST, check_case, daemon, lane, request

CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    # --- program and runtime digest (never substituted)
    ("program missing", lane(programs={"other": [DIGEST]}), request(), ["program: lacks vibe-qc"]),
    ("no programs", daemon(programs=DROP), request(), ["program: lacks vibe-qc"]),
    (
        "runtime digest missing",
        lane(programs={"vibe-qc": [OTHER_DIGEST]}),
        request(),
        [f"program: lacks vibe-qc runtime {DIGEST}"],
    ),
    ("runtime digest not current", lane(programs={"vibe-qc": [OTHER_DIGEST, DIGEST]}), request(), []),
    ("no digest requested", lane(programs={"vibe-qc": [OTHER_DIGEST]}), request(runtime_digest=DROP), []),
]


@pytest.mark.parametrize(("target", "req", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_program(target: dict[str, Any], req: dict[str, Any], expected: list[str]) -> None:
    check_case(requirement, target, req, expected)
