"""The one home of numbers in JSON: an amount or a figure as a JSON number, whole values as integers.

``Decimal('29')`` -> ``29``, ``Decimal('0.5')`` -> ``0.5``, ``14400.0`` -> ``14400``, ``0.5`` -> ``0.5``.
Decimals that are not whole become floats (exact up to 15 significant digits: the amounts this service
stores have at most 6 decimals); floats that are whole become integers while they are exactly integers
(below 2**53), so ``1e300`` stays a float. ``None`` stays ``None``.
"""

from __future__ import annotations

from decimal import Decimal

EXACT_INTEGER_FLOAT = 2**53  # every whole float below this is an exact integer


def num(value: Decimal | int | float | None) -> int | float | None:
    """``value`` as a JSON number (see the module docstring); ``None`` stays ``None``."""
    if value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < EXACT_INTEGER_FLOAT else value
    d = Decimal(value)
    if d == d.to_integral_value():
        return int(d)
    return float(d)
