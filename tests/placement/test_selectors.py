"""Selectors: shorthand parse (every operator, spacing, keywords), parse errors with their position,
format, the parse(format(s)) == s property, and matching (every operator and edge case)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.errors import InvalidInput
from app.placement.model import Atom, MatchExpression, NodeInventory, Selector
from app.placement.request import DeviceRequestBody, MatchExpressionBody
from app.placement.selectors import (
    expression_matches,
    format_selector,
    parse_selector,
    selector_matches,
    value_text,
)


def E(key: str, op: str, *values: Any) -> MatchExpression:  # noqa: N802
    return MatchExpression(key, op, tuple(values))  # type: ignore[arg-type]


PARSES = [
    ("gpuProduct in (H100-SXM5-80GB)", [E("gpuProduct", "In", "H100-SXM5-80GB")]),
    ("gpuProduct in (a, b,c)", [E("gpuProduct", "In", "a", "b", "c")]),
    ("zone notin (a, b)", [E("zone", "NotIn", "a", "b")]),
    ("mig.capable = true", [E("mig.capable", "In", "true")]),
    ("mig.capable == true", [E("mig.capable", "In", "true")]),
    ("rack != r13", [E("rack", "NotIn", "r13")]),
    ("fabric.domain", [E("fabric.domain", "Exists")]),
    ("!fabric.domain", [E("fabric.domain", "DoesNotExist")]),
    ("! fabric.domain", [E("fabric.domain", "DoesNotExist")]),
    ("vramGiB > 40", [E("vramGiB", "Gt", Decimal(40))]),
    ("vramGiB >= 80", [E("vramGiB", "Gte", Decimal(80))]),
    ("vramGiB < 80", [E("vramGiB", "Lt", Decimal(80))]),
    ("vramGiB <= 80.5", [E("vramGiB", "Lte", Decimal("80.5"))]),
    ("t > -1.25", [E("t", "Gt", Decimal("-1.25"))]),
    ("t > +3", [E("t", "Gt", Decimal(3))]),
    ("t>=.5", [E("t", "Gte", Decimal("0.5"))]),
    ("notin=in", [E("notin", "In", "in")]),
    ("in in (in, notin)", [E("in", "In", "in", "notin")]),
    ("notin notin (x)", [E("notin", "NotIn", "x")]),
    ("in", [E("in", "Exists")]),
    ("a/b_c-d.e = x/y:z", [E("a/b_c-d.e", "In", "x/y:z")]),
    (" \t\r\n a \n= \t b \r\n, c ", [E("a", "In", "b"), E("c", "Exists")]),
    ("a in(x),b", [E("a", "In", "x"), E("b", "Exists")]),
    (
        "gpuProduct in (H100-SXM5-80GB), vramGiB >= 80, mig.capable = true, fabric.domain",
        [
            E("gpuProduct", "In", "H100-SXM5-80GB"),
            E("vramGiB", "Gte", Decimal(80)),
            E("mig.capable", "In", "true"),
            E("fabric.domain", "Exists"),
        ],
    ),
]


@pytest.mark.parametrize(("text", "expressions"), PARSES)
def test_parse(text: str, expressions: list[MatchExpression]) -> None:
    assert parse_selector(text) == Selector(tuple(expressions))


@pytest.mark.parametrize("text", ["", "   ", "\t\r\n "])
def test_empty_is_no_selector(text: str) -> None:
    assert parse_selector(text) is None


ERRORS = [
    # (text, 0-based position, words in the message)
    ("a in ()", 6, "empty value set"),
    ("a in (x,,y)", 8, "expected a value"),
    ("a in (x,)", 8, "expected a value"),
    ("a in x", 5, "expected '('"),
    ("a in (x", 7, "expected ',' or ')'"),
    ("a in (x y)", 8, "expected ',' or ')'"),
    ("a =", 3, "expected a value"),
    ("a = ,b", 4, "expected a value"),
    ("a > x", 4, "needs a number"),
    ("a > NaN", 4, "needs a number"),
    ("a > inf", 4, "needs a number"),
    ("a > -Infinity", 4, "needs a number"),
    ("a >", 3, "needs a number"),
    ("a b", 2, "expected an operator"),
    ("a (x)", 2, "expected an operator"),
    ("a = b c", 6, "expected ',' between terms"),
    ("a = b = c", 6, "expected ',' between terms"),
    ("a,", 2, "expected a term after ','"),
    (",a", 0, "expected a key"),
    ("a,,b", 2, "expected a key"),
    ("9gpu = x", 0, "invalid key"),
    ("_x", 0, "invalid key"),
    ("!", 1, "expected a key"),
    ("!9x", 1, "invalid key"),
    ("!= x", 0, "expected a key"),
    ("k:ey = x", 0, "invalid key"),
    ("a notin", 7, "expected '('"),
    ("a)", 1, "expected an operator"),
]


@pytest.mark.parametrize(("text", "position", "words"), ERRORS)
def test_parse_errors_name_the_position(text: str, position: int, words: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_selector(text)
    error = caught.value
    assert error.path == "selector"
    assert error.details["position"] == position
    assert f"at position {position}" in error.message
    assert words in error.message
    assert error.to_body()["error"]["code"] == "INVALID_INPUT"


def test_limits() -> None:
    assert parse_selector(", ".join(f"k{i}" for i in range(32))) is not None
    with pytest.raises(InvalidInput, match="more than 32 expressions"):
        parse_selector(", ".join(f"k{i}" for i in range(33)))
    assert parse_selector("k in (" + ", ".join(str(i) for i in range(64)) + ")") is not None
    with pytest.raises(InvalidInput, match="more than 64 values"):
        parse_selector("k in (" + ", ".join(str(i) for i in range(65)) + ")")
    with pytest.raises(InvalidInput, match="invalid key"):
        parse_selector("k" * 254)


@pytest.mark.parametrize(
    ("selector", "text"),
    [
        (Selector((E("a", "In", "x"),)), "a = x"),
        (Selector((E("a", "In", "x", "y"),)), "a in (x, y)"),
        (Selector((E("a", "NotIn", "x"),)), "a != x"),
        (Selector((E("a", "NotIn", "x", "y"),)), "a notin (x, y)"),
        (Selector((E("a", "Exists"), E("b", "DoesNotExist"))), "a, !b"),
        (Selector((E("v", "Gte", Decimal(80)), E("v", "Lt", Decimal("-0.5")))), "v >= 80, v < -0.5"),
        (Selector((E("v", "Gt", Decimal(1)), E("v", "Lte", Decimal(2)))), "v > 1, v <= 2"),
    ],
)
def test_format(selector: Selector, text: str) -> None:
    assert format_selector(selector) == text
    assert parse_selector(text) == selector


@pytest.mark.parametrize("value", ["", "a b", "a,b", "(x)", "a=b", "!x", "<", ">"])
def test_format_refuses_values_the_shorthand_cannot_carry(value: str) -> None:
    with pytest.raises(ValueError):
        format_selector(Selector((E("k", "In", value),)))


# -- the round-trip property -----------------------------------------------------------------------

KEY_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._/-"
VALUE_CHARS = KEY_CHARS + ":+@#%^&*~|;'\"?[]{}$"
keys = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    st.text(KEY_CHARS, max_size=20),
)
values = st.text(VALUE_CHARS, min_size=1, max_size=12) | st.sampled_from(["in", "notin", "true", "80"])
numbers = st.decimals(allow_nan=False, allow_infinity=False, places=None) | st.integers(
    -(10**12), 10**12
).map(Decimal)
expressions = st.one_of(
    st.builds(lambda k, vs: E(k, "In", *vs), keys, st.lists(values, min_size=1, max_size=64)),
    st.builds(lambda k, vs: E(k, "NotIn", *vs), keys, st.lists(values, min_size=1, max_size=64)),
    st.builds(lambda k: E(k, "Exists"), keys),
    st.builds(lambda k: E(k, "DoesNotExist"), keys),
    st.builds(lambda k, op, n: E(k, op, n), keys, st.sampled_from(["Gt", "Gte", "Lt", "Lte"]), numbers),
)
selectors = st.lists(expressions, min_size=1, max_size=32).map(lambda es: Selector(tuple(es)))


@given(selectors)
def test_parse_format_round_trip(selector: Selector) -> None:
    text = format_selector(selector)
    assert parse_selector(text) == selector


@given(selectors)
def test_shorthand_and_json_forms_agree(selector: Selector) -> None:
    # the request body accepts the shorthand string and validates it like the JSON form
    body = DeviceRequestBody.model_validate(
        {"class": "gpu", "count": 1, "selector": format_selector(selector)}
    )
    assert body.to_device_request().selector == selector


# -- matching -------------------------------------------------------------------------------------

ATOM = Atom(
    id="GPU-1",
    device_class="gpu",
    attributes={
        "gpuProduct": "H100-SXM5-80GB",
        "vramGiB": 80,
        "migCapable": True,
        "computeCapability": "9.0",
        "ratio": 0.5,
        "big": Decimal("80.0"),
        "nothing": None,
        "rack": "device-rack",
    },
)
LABELS = {
    "fabric.domain": "fd-1",
    "rack": "r13",
    "cuda.driver.major": "550",
    "bc.dev/driver.kvm": "1.2",
    "bc.dev/fake": "1",
    "nothing": "from-label",
}
SOURCES = {"bc.dev/driver.kvm": "system", "bc.dev/fake": "operator"}

MATCHES = [
    # In / NotIn compare as strings, attribute first then label
    (E("gpuProduct", "In", "H100-SXM5-80GB"), True),
    (E("gpuProduct", "In", "A100", "H100-SXM5-80GB"), True),
    (E("gpuProduct", "In", "h100-sxm5-80gb"), False),
    (E("vramGiB", "In", "80"), True),
    (E("vramGiB", "In", "80.0"), False),
    (E("big", "In", "80"), True),
    (E("migCapable", "In", "true"), True),
    (E("migCapable", "In", "True"), False),
    (E("ratio", "In", "0.5"), True),
    (E("rack", "In", "device-rack"), True),  # the attribute shadows the label
    (E("rack", "In", "r13"), False),
    (E("fabric.domain", "In", "fd-1"), True),  # a node label
    (E("missing", "In", "x"), False),
    (E("gpuProduct", "NotIn", "A100"), True),
    (E("gpuProduct", "NotIn", "H100-SXM5-80GB"), False),
    (E("missing", "NotIn", "x"), True),  # NotIn holds when the key is absent
    (E("nothing", "In", "from-label"), True),  # a null attribute falls through to the label
    # Exists / DoesNotExist
    (E("fabric.domain", "Exists"), True),
    (E("migCapable", "Exists"), True),
    (E("missing", "Exists"), False),
    (E("missing", "DoesNotExist"), True),
    (E("gpuProduct", "DoesNotExist"), False),
    # bc.dev/ labels count only when their source is system
    (E("bc.dev/driver.kvm", "Exists"), True),
    (E("bc.dev/fake", "Exists"), False),
    (E("bc.dev/fake", "DoesNotExist"), True),
    # comparisons are numeric; a non-number never matches
    (E("vramGiB", "Gte", Decimal(80)), True),
    (E("vramGiB", "Gt", Decimal(80)), False),
    (E("vramGiB", "Lt", Decimal("80.5")), True),
    (E("vramGiB", "Lte", Decimal(79)), False),
    (E("computeCapability", "Gte", Decimal("8.9")), True),  # "9.0" is a number
    (E("cuda.driver.major", "Gt", Decimal(535)), True),  # a label value that is a number
    (E("gpuProduct", "Gt", Decimal(0)), False),
    (E("gpuProduct", "Lt", Decimal(0)), False),
    (E("migCapable", "Gt", Decimal(0)), False),  # booleans are not numbers
    (E("missing", "Gt", Decimal(0)), False),
    (E("missing", "Lte", Decimal(0)), False),
    (E("ratio", "Gt", Decimal("0.25")), True),
    (E("big", "Gte", Decimal(80)), True),
]


@pytest.mark.parametrize(("expr", "expected"), MATCHES)
def test_expression_matches(expr: MatchExpression, expected: bool) -> None:
    assert expression_matches(expr, ATOM, LABELS, SOURCES) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpuProduct in (H100-SXM5-80GB), vramGiB >= 80, migCapable = true, fabric.domain", True),
        ("gpuProduct in (H100-SXM5-80GB), vramGiB > 80", False),
        ("!fabric.domain", False),
        ("rack != r13", True),
    ],
)
def test_selector_matches_all_expressions(text: str, expected: bool) -> None:
    node = NodeInventory(id="n", name="n", labels=LABELS, label_sources=SOURCES, atoms=(ATOM,))
    assert selector_matches(parse_selector(text), ATOM, node) is expected


def test_no_selector_matches() -> None:
    assert selector_matches(None, ATOM, NodeInventory(id="n", name="n"))


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (True, "true"),
        (False, "false"),
        (80, "80"),
        (80.0, "80"),
        (0.5, "0.5"),
        (Decimal("80.0"), "80"),
        ("x", "x"),
    ],
)
def test_value_text(value: Any, text: str) -> None:
    assert value_text(value) == text


@pytest.mark.parametrize(
    "body",
    [
        {"key": "9x", "op": "Exists"},
        {"key": "x", "op": "Gt", "values": ["abc"]},
        {"key": "x", "op": "Gt", "values": [1, 2]},
        {"key": "x", "op": "In", "values": []},
        {"key": "x", "op": "Exists", "values": ["a"]},
        {"key": "x", "op": "In", "values": [str(i) for i in range(65)]},
    ],
)
def test_json_form_limits_match_the_shorthand(body: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        MatchExpressionBody.model_validate(body)
