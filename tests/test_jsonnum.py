"""The one number-to-JSON rule (app/jsonnum.py): whole values as integers, others as they are."""

from __future__ import annotations

from decimal import Decimal

import pytest

from app.jsonnum import num


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (Decimal("29"), 29),
        (Decimal("29.000000"), 29),
        (Decimal("0.5"), 0.5),
        (Decimal("0.290000"), 0.29),
        (7, 7),
        (14400.0, 14400),
        (0.5, 0.5),
        (-3.0, -3),
        (2.0**53, 2.0**53),  # not below 2**53: stays a float
        (1e300, 1e300),
        (None, None),
    ],
)
def test_num(value: object, shown: object) -> None:
    out = num(value)  # type: ignore[arg-type]
    assert out == shown and type(out) is type(shown)
