"""The one home of the scalar floor (docs/placement-rules.md, "Scalar room"): a node's capacity of a scalar
resource is
``floor(allocatable x ratio)``, in exact ``Decimal`` arithmetic, so 100 x 0.29 is 29 as in the SQL guards
(``floor(allocatable * ratio)`` over ``numeric``), not 28. Read by the ``scalars`` filter (room = capacity -
the peak held) and by the inventory's capacity rollup. Pure: no I/O.
"""

from __future__ import annotations

from decimal import ROUND_FLOOR, Decimal

from app.placement.context import amount_decimal


def scalar_capacity(allocatable: object, ratio: object) -> Decimal:
    """``floor(allocatable x ratio)`` as a whole ``Decimal``: ``(100, 0.29)`` -> ``29``; ``(8, 1.5)`` ->
    ``12``. Floats are read through their text (0.29 stays 0.29)."""
    return (amount_decimal(allocatable) * amount_decimal(ratio)).to_integral_value(rounding=ROUND_FLOOR)
