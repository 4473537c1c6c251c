"""Figures as the explanation shows them, and the one exact bound comparison (docs/explain.md).

Shared by the requirement reasons (:mod:`app.fleet.requirements`), the completion components
(:mod:`app.fleet.prediction`) and the output (:mod:`app.fleet.render`), so that reasons, text and JSON
agree on every number. Pure: no clock, no I/O.
"""

from __future__ import annotations

from fractions import Fraction

from app.jsonnum import num


def exact(value: float | int) -> Fraction:
    """A decimal figure as an exact fraction (``0.7`` is 7/10), so bounds compare without float noise:
    equality at the walltime bound fits."""
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def exceeds(runtime_high: float, speed_factor: float, bound: int) -> bool:
    """``runtime_high / speed_factor > bound``, exactly (equality fits): floats decide unless the two
    sides are within rounding of each other, and then exact decimal fractions do (``7 / 0.7 == 10``)."""
    upper = runtime_high / speed_factor
    if abs(upper - bound) > 1e-9 * max(1.0, abs(upper)):
        return upper > bound
    return exact(runtime_high) / exact(speed_factor) > bound


def num_text(value: float | int) -> str:
    """A figure for people: integers plain, others with at most 3 decimals (``2.5``, ``0.333``)."""
    rounded = round(float(value), 3)
    if rounded.is_integer():
        return str(int(rounded))
    return f"{rounded:.3f}".rstrip("0").rstrip(".")


def json_num(value: float | int | None) -> float | int | None:
    """A figure for JSON: rounded to 3 decimals, integral values as integers; None stays None."""
    if value is None:
        return None
    return num(round(float(value), 3))


def labels_text(values: list[str] | tuple[str, ...]) -> str:
    """Labels for people: ``a, b``, or ``none`` for an empty list."""
    return ", ".join(values) if values else "none"


def interval_text(low: float, high: float) -> str:
    """An interval in people's figures: ``6000-8400``, or one figure when both ends show the same."""
    return num_text(low) if num_text(low) == num_text(high) else f"{num_text(low)}-{num_text(high)}"
