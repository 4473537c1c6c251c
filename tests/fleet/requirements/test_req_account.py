"""Hard requirement `account`: its table, run alone and through the whole explanation.

docs/explain.md, "Hard requirements and their reasons": a target is rejected when it "does not permit the
requested account, or its permitted accounts are
unknown".
"""

from __future__ import annotations

from typing import Any

import pytest

from app.fleet.requirements import account as requirement
from tests.fleet.requirements.tables import DROP, check_case, lane, request

CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    # --- account (unknown permissions reject; exact match including case)
    ("account unknown", lane(accounts=DROP), request(), ["account: permitted accounts unknown, want chem"]),
    ("account case", lane(accounts=["Chem"]), request(), ["account: chem not permitted (permits Chem)"]),
    ("no accounts permitted", lane(accounts=[]), request(), ["account: chem not permitted (permits none)"]),
    ("account permitted", lane(accounts=["bio", "chem"]), request(), []),
    ("account not requested", lane(accounts=DROP), request(account=DROP), []),
]


@pytest.mark.parametrize(("target", "req", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_account(target: dict[str, Any], req: dict[str, Any], expected: list[str]) -> None:
    check_case(requirement, target, req, expected)
