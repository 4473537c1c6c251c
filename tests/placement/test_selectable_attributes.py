"""What a selector reads on an atom (docs/selectors.md): the NUMA node as ``numaNode`` however the atom
was stored, and never a ``bc.dev/`` device attribute (only a ``system`` node label of that key)."""

from __future__ import annotations

from typing import Any

import pytest

from app.placement.model import Atom, MatchExpression, selectable_attributes
from app.placement.selectors import expression_matches

SYSTEM, OPERATOR = "system", "operator"


@pytest.mark.parametrize(
    ("attributes", "numa", "expected"),
    [
        ({}, None, {}),
        ({"vramGiB": 80}, 1, {"vramGiB": 80, "numaNode": 1}),
        ({"numaNode": 1}, 1, {"numaNode": 1}),
        ({"numaNode": 0}, 1, {"numaNode": 1}),  # the column wins: the pick reads it
        ({"numaNode": 2}, None, {"numaNode": 2}),
    ],
)
def test_selectable_attributes(
    attributes: dict[str, Any], numa: int | None, expected: dict[str, Any]
) -> None:
    assert selectable_attributes(attributes, numa) == expected


def test_attributes_that_say_it_already_are_shared_not_copied() -> None:
    shared = {"numaNode": 1, "vramGiB": 80}
    assert selectable_attributes(shared, 1) is shared
    assert selectable_attributes(shared, None) is shared


@pytest.mark.parametrize(
    ("attributes", "labels", "sources", "holds"),
    [
        ({"bc.dev/driver.nvidia": "580"}, {}, {}, False),  # an attribute never counts
        (
            {"bc.dev/driver.nvidia": "580"},
            {"bc.dev/driver.nvidia": "580"},
            {"bc.dev/driver.nvidia": SYSTEM},
            True,
        ),
        ({}, {"bc.dev/driver.nvidia": "580"}, {"bc.dev/driver.nvidia": OPERATOR}, False),
        ({"driver.nvidia": "580"}, {}, {}, True),  # outside the namespace: the attribute is read
    ],
)
def test_a_bc_dev_key_is_read_only_from_a_system_label(
    attributes: dict[str, Any], labels: dict[str, str], sources: dict[str, str], holds: bool
) -> None:
    key = next(iter(attributes or labels))
    atom = Atom("GPU-0", "gpu", attributes, 0)
    assert expression_matches(MatchExpression(key, "Exists", ()), atom, labels, sources) is holds
