"""The one labels rule (app/placement/system_labels.py, ``unmet_label``), as a table."""

from __future__ import annotations

import pytest

from app.placement.system_labels import unmet_label

LABELS = {"rack": "r1", "bc.dev/cap.devices.limits": "1", "bc.dev/fake": "1", "zone": "a"}
SOURCES = {"rack": "operator", "bc.dev/cap.devices.limits": "system", "bc.dev/fake": "operator"}


@pytest.mark.parametrize(
    ("wanted", "reason"),
    [
        ((), None),
        ((("rack", "r1"),), None),
        ((("rack", "*"),), None),
        ((("rack", "r2"),), "rack is r1, want r2"),
        ((("row", "*"),), "missing row"),
        ((("bc.dev/cap.devices.limits", "*"),), None),  # a system label counts
        ((("bc.dev/fake", "*"),), "missing bc.dev/fake"),  # an operator's bc.dev/ label does not exist
        ((("zone", "a"),), None),  # a label without a source row is an operator's, and counts
        ((("row", "*"), ("rack", "r2")), "missing row"),  # the first unmet, in the request's order
        ((("rack", "r2"), ("row", "*")), "rack is r1, want r2"),
    ],
)
def test_unmet_label(wanted: tuple[tuple[str, str], ...], reason: str | None) -> None:
    assert unmet_label(wanted, LABELS, SOURCES) == reason
