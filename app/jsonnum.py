"""The one home of numbers in JSON: an amount or a figure as a JSON number, whole values as integers.

``Decimal('29')`` -> ``29``, ``Decimal('0.5')`` -> ``0.5``, ``14400.0`` -> ``14400``, ``0.5`` -> ``0.5``.
Decimals that are not whole become floats (exact up to 15 significant digits: the amounts this service
stores have at most 6 decimals); floats that are whole become integers while they are exactly integers
(below 2**53), so ``1e300`` stays a float. ``None`` stays ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

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


def must_be_json_number(value: Any) -> Any:
    """Refuse a string or a boolean where a JSON number is wanted (pydantic's lax mode would read ``"8"``
    or ``true`` as a number); raises ``ValueError``."""
    if isinstance(value, (bool, str)):
        raise ValueError("must be a JSON number")
    return value


@dataclass(frozen=True, slots=True)
class JsonDecimal:
    """An exact decimal amount in a request body, and its rule said once for both sides of the contract:
    ``Annotated[Decimal, JsonDecimal(max_digits=20, decimal_places=6, gt=0)]``.

    The service checks it as a :class:`~decimal.Decimal` (``gt``/``ge``/``le`` bounds, at most
    ``max_digits`` digits of which at most ``decimal_places`` after the point, no NaN or infinity; a
    ``numbers_only`` amount also refuses a numeric string). The OpenAPI document states the same rule in
    standard JSON Schema keywords (docs/api.md, "The contract"): ``exclusiveMinimum``/``minimum`` for the
    lower bound, ``maximum`` (or ``exclusiveMaximum: 10**whole digits``) for the upper one, and
    ``multipleOf: 10**-decimal_places`` for the places. Without this, pydantic writes its own constraint
    names (``gt``, ``max_digits``, ``decimal_places``) into the schema when a validator wraps the
    decimal, and no upper bound or places at all for a JSON number."""

    max_digits: int
    decimal_places: int
    gt: int | None = None
    ge: int | None = None
    le: int | None = None
    numbers_only: bool = False

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        decimal = core_schema.decimal_schema(
            gt=self.gt,
            ge=self.ge,
            le=self.le,
            max_digits=self.max_digits,
            decimal_places=self.decimal_places,
            allow_inf_nan=False,
        )
        if self.numbers_only:
            return core_schema.no_info_before_validator_function(must_be_json_number, decimal)
        return decimal

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        number = self.number_schema()
        if self.numbers_only:
            return number
        # lax: pydantic's string branch (a pattern bounding digits and places) stays beside ours
        texts = [s for s in handler(schema).get("anyOf", []) if s.get("type") == "string"]
        return {"anyOf": [number, *texts]} if texts else number

    def number_schema(self) -> dict[str, Any]:
        """The JSON-number form: ``{"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e14,
        "multipleOf": 1e-06}`` for ``gt=0, max_digits=20, decimal_places=6``."""
        schema: dict[str, Any] = {"type": "number"}
        if self.gt is not None:
            schema["exclusiveMinimum"] = self.gt
        if self.ge is not None:
            schema["minimum"] = self.ge
        whole_limit = 10 ** (self.max_digits - self.decimal_places)  # whole digits cap the amount
        if self.le is not None and self.le < whole_limit:
            schema["maximum"] = self.le
        else:
            schema["exclusiveMaximum"] = whole_limit
        if self.gt is None and self.ge is None:
            schema["exclusiveMinimum"] = -whole_limit
        schema["multipleOf"] = float(Decimal(1).scaleb(-self.decimal_places))
        return schema
