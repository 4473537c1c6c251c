"""The stored form of a reservation's conditions (app/capacity/conditions.py): the JSON written to
``reservations.conditions`` is the fields each condition was made with, no more (pure, no database)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.answers.reservations import Condition
from app.capacity.conditions import (
    appended,
    condition,
    from_stored,
    no_fit_conditions,
    quota_exceeded_conditions,
    released_condition,
    stored,
    with_unschedulable,
)

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("made", "as_stored"),
    [
        (
            no_fit_conditions("no node fits (1 node): ...")[0],
            {
                "type": "Unschedulable",
                "status": "True",
                "reason": "NoFit",
                "message": "no node fits (1 node): ...",
            },
        ),
        (
            quota_exceeded_conditions("over quota")[0],
            {"type": "Unschedulable", "status": "True", "reason": "QuotaExceeded", "message": "over quota"},
        ),
        (
            released_condition(AT, "placed"),
            {
                "type": "Released",
                "status": "True",
                "reason": "ReleaseRequested",
                "message": "released at 2026-12-01T12:00:00+00:00 while placed",
                "at": "2026-12-01T12:00:00+00:00",
            },
        ),
        (  # a null given is kept (a Repaired condition's newNodeId while pending)
            condition("Repaired", "AtomUnavailable", "m", newNodeId=None, newAtoms=[]),
            {
                "type": "Repaired",
                "status": "True",
                "reason": "AtomUnavailable",
                "message": "m",
                "newNodeId": None,
                "newAtoms": [],
            },
        ),
    ],
)
def test_a_condition_is_stored_with_the_fields_it_was_made_with(made: Condition, as_stored: dict) -> None:
    assert stored([made]) == [as_stored]
    assert from_stored([as_stored]) == [made]
    assert stored(from_stored([as_stored])) == [as_stored]


def test_a_newer_unschedulable_replaces_the_one_before_and_appended_keeps_the_stored_form() -> None:
    story = [*no_fit_conditions("first"), released_condition(AT, "pending")]
    replaced = with_unschedulable(story, "QuotaExceeded", "second")
    assert [(c.type, c.reason, c.message) for c in replaced] == [
        ("Released", "ReleaseRequested", "released at 2026-12-01T12:00:00+00:00 while pending"),
        ("Unschedulable", "QuotaExceeded", "second"),
    ]
    assert appended(None, *no_fit_conditions("x")) == stored(no_fit_conditions("x"))
    assert appended(stored(story), released_condition(AT, "placed")) == stored(
        [*story, released_condition(AT, "placed")]
    )
    assert from_stored(None) == []
