"""Selectors: the shorthand grammar, its printer, and matching against atoms (docs/placement-rules.md,
"Device fit and
selectors"; docs/selectors.md).

Shorthand terms are separated by commas outside parentheses; whitespace (space, tab, CR, LF) is free
around every token::

    key in (v, ...)   key notin (v, ...)   key = v   key == v   key != v
    key               !key                 key > n   key >= n   key < n   key <= n

``in`` and ``notin`` are keywords only in operator position (``notin=in`` is key ``notin``, value ``in``).
A value is a run of characters other than whitespace and ``, ( ) = ! < >``. Comparison operands are
decimal numbers. Every error is :class:`~app.errors.InvalidInput` with ``path="selector"``, a message
naming the 0-based character position, and ``details["position"]``.

Matching reads the atom's device attribute first, then the node label of the same key. In/NotIn compare
as strings (``80`` -> ``"80"``, ``True`` -> ``"true"``); NotIn holds when the key is absent; the four
comparisons are numeric and a value that is not a number never matches. A ``bc.dev/`` node label counts
only when its source is ``system`` (the same rule as the labels filter), so an operator cannot fake one;
a ``bc.dev/`` device attribute never counts (no registration path stores one; a row written before that
rule is read past, to the node label), docs/selectors.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from app.errors import InvalidInput, quote_input
from app.placement.model import (
    COMPARISON_OPS,
    MAX_EXPRESSIONS,
    MAX_VALUES,
    Atom,
    MatchExpression,
    NodeInventory,
    Selector,
)
from app.placement.operands import KEY_RE, parse_decimal_operand
from app.placement.system_labels import is_system_key, label_counts

WHITESPACE = frozenset(" \t\r\n")
SPECIAL = frozenset(",()=!<>")
MAX_KEY_LENGTH = 253

_SYMBOL_OPS = {"=": "In", "==": "In", "!=": "NotIn", ">": "Gt", ">=": "Gte", "<": "Lt", "<=": "Lte"}
_OP_SYMBOLS = {"Gt": ">", "Gte": ">=", "Lt": "<", "Lte": "<="}
_MISSING = object()


def _error(message: str, position: int) -> InvalidInput:
    return InvalidInput(
        f"selector: {message} at position {position}", path="selector", details={"position": position}
    )


class _Scanner:
    """A cursor over the shorthand text; positions are 0-based character offsets."""

    __slots__ = ("text", "pos")

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def skip_space(self) -> None:
        text, pos = self.text, self.pos
        while pos < len(text) and text[pos] in WHITESPACE:
            pos += 1
        self.pos = pos

    def peek(self) -> str:
        self.skip_space()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def word(self) -> tuple[str, int]:
        """The run of value characters at the cursor (possibly empty) and where it starts."""
        self.skip_space()
        start = pos = self.pos
        text = self.text
        while pos < len(text) and text[pos] not in WHITESPACE and text[pos] not in SPECIAL:
            pos += 1
        self.pos = pos
        return text[start:pos], start

    def symbol(self) -> tuple[str, int]:
        """An operator symbol at the cursor (``= == != < <= > >=``) or ``""``."""
        self.skip_space()
        start, text = self.pos, self.text
        two = text[start : start + 2]
        if two in ("==", "!=", ">=", "<="):
            self.pos += 2
            return two, start
        if text[start : start + 1] in ("=", "<", ">"):
            self.pos += 1
            return text[start], start
        return "", start


def _check_key(key: str, position: int) -> None:
    if not key:
        raise _error("expected a key", position)
    if not KEY_RE.match(key) or len(key) > MAX_KEY_LENGTH:
        raise _error(
            f"invalid key {quote_input(key)} "
            "(a key starts with a letter and holds letters, digits, '.', '_', '/', '-')",
            position,
        )


def _value(scanner: _Scanner) -> str:
    value, position = scanner.word()
    if not value:
        found = scanner.text[position : position + 1]
        raise _error(
            f"expected a value, found {quote_input(found)}" if found else "expected a value", position
        )
    return value


def _value_set(scanner: _Scanner) -> tuple[str, ...]:
    if scanner.peek() != "(":
        raise _error("expected '('", scanner.pos)
    scanner.pos += 1
    values: list[str] = []
    while True:
        if not values and scanner.peek() == ")":
            raise _error("empty value set", scanner.pos)
        values.append(_value(scanner))
        if len(values) > MAX_VALUES:
            raise _error(f"more than {MAX_VALUES} values in one expression", scanner.pos)
        nxt = scanner.peek()
        if nxt == ",":
            scanner.pos += 1
            continue
        if nxt == ")":
            scanner.pos += 1
            return tuple(values)
        raise _error("expected ',' or ')'", scanner.pos)


def _term(scanner: _Scanner) -> MatchExpression:
    if scanner.peek() == "!" and scanner.text[scanner.pos + 1 : scanner.pos + 2] != "=":
        scanner.pos += 1
        key, position = scanner.word()
        _check_key(key, position)
        return MatchExpression(key, "DoesNotExist")
    key, position = scanner.word()
    _check_key(key, position)
    nxt = scanner.peek()
    if nxt in ("", ","):
        return MatchExpression(key, "Exists")
    symbol, symbol_at = scanner.symbol()
    if symbol:
        op = _SYMBOL_OPS[symbol]
        if op in COMPARISON_OPS:
            operand, operand_at = scanner.word()
            number = parse_decimal_operand(operand) if operand else None
            if number is None:
                raise _error(f"{symbol} needs a number, found {quote_input(operand)}", operand_at)
            return MatchExpression(key, op, (number,))  # type: ignore[arg-type]
        return MatchExpression(key, op, (_value(scanner),))  # type: ignore[arg-type]
    keyword, keyword_at = scanner.word()
    if keyword == "in":
        return MatchExpression(key, "In", _value_set(scanner))
    if keyword == "notin":
        return MatchExpression(key, "NotIn", _value_set(scanner))
    where = keyword_at if keyword else symbol_at
    found = keyword or scanner.text[where : where + 1]
    raise _error(f"expected an operator or ',' after {quote_input(key)}, found {quote_input(found)}", where)


def parse_selector(text: str) -> Selector | None:
    """Parse the shorthand ``text`` into a :class:`Selector`; ``None`` for an empty (or all-whitespace)
    string, which is no selector.

    Shape: ``"gpuProduct in (H100-SXM5-80GB), vramGiB >= 80, mig.capable = true, fabric.domain"`` ->
    ``Selector((In gpuProduct [..]), (Gte vramGiB [Decimal(80)]), (In mig.capable ['true']),
    (Exists fabric.domain))``. Limits: 32 expressions, 64 values each, keys as the seed says.
    Raises :class:`InvalidInput` (path ``selector``) naming the 0-based character position.
    """
    scanner = _Scanner(text)
    if scanner.peek() == "":
        return None
    expressions: list[MatchExpression] = []
    while True:
        term_at = scanner.pos
        expressions.append(_term(scanner))
        if len(expressions) > MAX_EXPRESSIONS:
            raise _error(f"more than {MAX_EXPRESSIONS} expressions", term_at)
        nxt = scanner.peek()
        if nxt == "":
            return Selector(tuple(expressions))
        if nxt != ",":
            raise _error(f"expected ',' between terms, found {quote_input(nxt)}", scanner.pos)
        scanner.pos += 1
        if scanner.peek() == "":
            raise _error("expected a term after ','", scanner.pos)


def _shorthand_value(value: str | Decimal) -> str:
    text = str(value)
    if not text or any(c in WHITESPACE or c in SPECIAL for c in text):
        raise ValueError(f"value {quote_input(text)} cannot be written in the selector shorthand")
    return text


def format_selector(selector: Selector) -> str:
    """The shorthand for ``selector``, such that ``parse_selector(format_selector(s)) == s``.

    One-value In/NotIn print as ``key = v`` / ``key != v``, sets as ``key in (a, b)``, comparisons as
    ``key >= 80``, Exists as ``key``, DoesNotExist as ``!key``; terms are joined by ``", "``. Raises
    ``ValueError`` for a value the shorthand cannot carry (empty, whitespace or one of ``,()=!<>``).
    """
    terms: list[str] = []
    for e in selector.match_expressions:
        if e.op == "Exists":
            terms.append(e.key)
        elif e.op == "DoesNotExist":
            terms.append(f"!{e.key}")
        elif e.op in COMPARISON_OPS:
            terms.append(f"{e.key} {_OP_SYMBOLS[e.op]} {_shorthand_value(e.values[0])}")
        elif len(e.values) == 1:
            terms.append(f"{e.key} {'=' if e.op == 'In' else '!='} {_shorthand_value(e.values[0])}")
        else:
            word = "in" if e.op == "In" else "notin"
            terms.append(f"{e.key} {word} ({', '.join(_shorthand_value(v) for v in e.values)})")
    return ", ".join(terms)


def value_text(value: Any) -> str:
    """How an attribute or label value compares in In/NotIn: ``True`` -> ``"true"``, ``80`` and
    ``80.0`` -> ``"80"``, ``Decimal("80.0")`` -> ``"80"``, other numbers their shortest text, strings
    unchanged."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, Decimal):
        if value.is_finite() and value == value.to_integral_value():
            return str(int(value))
        return str(value)
    return str(value)


def value_number(value: Any) -> Decimal | None:
    """A value as a number for Gt/Gte/Lt/Lte, or ``None`` when it is not a number (booleans, NaN,
    infinities, non-numeric text)."""
    if isinstance(value, Decimal):
        return value if value.is_finite() else None
    return parse_decimal_operand(value)


def lookup(key: str, atom: Atom, node_labels: Mapping[str, str], label_sources: Mapping[str, str]) -> Any:
    """The value an expression reads: the atom's attribute ``key`` (never under ``bc.dev/``), else the
    node label ``key`` (a ``bc.dev/`` label only when its source is ``system``), else a missing marker."""
    value = _MISSING if is_system_key(key) else atom.attributes.get(key, _MISSING)
    if value is not _MISSING and value is not None:
        return value
    value = node_labels.get(key, _MISSING)
    if value is not _MISSING and not label_counts(key, label_sources.get(key)):
        return _MISSING
    return value


def expression_holds(expr: MatchExpression, value: Any) -> bool:
    op = expr.op
    if op == "Exists":
        return value is not _MISSING
    if op == "DoesNotExist":
        return value is _MISSING
    if op == "In":
        return value is not _MISSING and value_text(value) in expr.values
    if op == "NotIn":
        return value is _MISSING or value_text(value) not in expr.values
    if value is _MISSING:
        return False
    number = value_number(value)
    operand = value_number(expr.values[0]) if expr.values else None
    if number is None or operand is None:
        return False
    if op == "Gt":
        return number > operand
    if op == "Gte":
        return number >= operand
    if op == "Lt":
        return number < operand
    return number <= operand


def expression_matches(
    expr: MatchExpression,
    atom: Atom,
    node_labels: Mapping[str, str],
    label_sources: Mapping[str, str] | None = None,
) -> bool:
    """Whether one matchExpression holds for ``atom`` on a node with ``node_labels``
    (docs/placement-rules.md: device
    attribute first, then node label; In/NotIn as strings, NotIn true when absent; comparisons numeric,
    a non-number never matches). ``label_sources`` (key -> ``system``/``operator``) gates ``bc.dev/``
    labels; without it such labels are treated as operator-set and ignored."""
    return expression_holds(expr, lookup(expr.key, atom, node_labels, label_sources or {}))


def selector_matches(selector: Selector | None, atom: Atom, node: NodeInventory) -> bool:
    """Whether every expression of ``selector`` holds for ``atom`` on ``node`` (``None`` matches all)."""
    if selector is None:
        return True
    labels, sources = node.labels, node.label_sources
    return all(expression_holds(e, lookup(e.key, atom, labels, sources)) for e in selector.match_expressions)
