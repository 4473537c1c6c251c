"""Lexical rules shared by the request models (:mod:`app.placement.request`) and the selector grammar
(:mod:`app.placement.selectors`): the key syntax and decimal comparison operands (docs/placement-rules.md,
"Device fit
and selectors"). A leaf module: it imports nothing of the app, so both can import it without a cycle."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

KEY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9._/-]*$")  # docs/placement-rules.md: letters, digits, ., _, / and -


def parse_decimal_operand(value: Any) -> Decimal | None:
    """A comparison operand as ``Decimal``: a JSON number or a decimal string (sign and fraction
    allowed). NaN, infinities, booleans and anything else give ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float, Decimal)):
        text = repr(value) if isinstance(value, float) else str(value)
    elif isinstance(value, str):
        text = value.strip()
        if not re.fullmatch(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", text):
            return None
    else:
        return None
    try:
        number = Decimal(text)
    except InvalidOperation:
        return None
    return number if number.is_finite() else None
