"""Decimal amounts in JSON answers: whole numbers as ints, others as floats (exact up to 15 digits)."""

from __future__ import annotations

from decimal import Decimal


def num(value: Decimal | int | float | None) -> int | float | None:
    """``Decimal('29')`` -> ``29``; ``Decimal('0.5')`` -> ``0.5``; ``None`` stays ``None``."""
    if value is None:
        return None
    d = Decimal(value)
    if d == d.to_integral_value():
        return int(d)
    return float(d)
