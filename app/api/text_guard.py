"""Checks of a JSON body that its models cannot make, applied to every route (one parse per body).

- Text PostgreSQL cannot store is bad input, not a server error: PostgreSQL refuses the NUL character in
  ``text`` and ``jsonb``, and a lone UTF-16 surrogate (``\\ud800`` in JSON) is no character at all.
  Found by fuzzing the API with schemathesis: such strings reached the database and answered 500.
- A JSON object that names one key twice is ambiguous: the parser would keep the last value silently
  (two ``tenantId`` fields, two capacity answers for one target, which docs/explain.md refuses).

Both answer 422 ``INVALID_INPUT`` naming the field.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from app.errors import InvalidInput, clip_input


def _bad_text(value: str) -> str | None:
    if "\x00" in value:
        return "contains a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate, which is not a character"
    return None


def find_unstorable(value: Any, path: str = "") -> tuple[str, str] | None:
    """The first ``(path, problem)`` of a string (or object key) PostgreSQL cannot store, or None."""
    if isinstance(value, str):
        problem = _bad_text(value)
        return (path, problem) if problem else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            problem = _bad_text(key)
            if problem:
                return where, f"key {problem}"
            found = find_unstorable(item, where)
            if found:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = find_unstorable(item, f"{path}.{i}" if path else str(i))
            if found:
                return found
    return None


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


async def check_json_body(request: Request) -> None:
    """422 when a JSON body names a key twice or holds text PostgreSQL cannot store."""
    if request.method not in ("POST", "PUT", "PATCH"):
        return
    body = await request.body()
    if not body:
        return
    try:
        data = json.loads(body, object_pairs_hook=_no_duplicate_keys)
    except _DuplicateKey as duplicate:
        key = clip_input(duplicate.key)
        raise InvalidInput(f"{key}: named twice in one JSON object", path=key) from None
    except (ValueError, RecursionError):
        return  # not JSON (or nested past the guard's limit): the body validation answers that
    if request.url.path in PER_ITEM_ROUTES and isinstance(data, dict) and isinstance(data.get("items"), list):
        data = {key: value for key, value in data.items() if key != "items"}  # the route checks each item
    found = find_unstorable(data)
    if found:
        raise unstorable(found)


# routes whose body is ``{items: [...]}`` of independent items: an item's unstorable text is that item's
# 422 alone (:func:`unstorable_item`), not the whole call's (issue 15: one item's error does not fail
# the others)
PER_ITEM_ROUTES = frozenset({"/v1/reservations/batch"})


def unstorable(found: tuple[str, str]) -> InvalidInput:
    """The 422 for :func:`find_unstorable`'s ``(path, problem)``."""
    path, problem = clip_input(found[0]), found[1]
    return InvalidInput(f"{path}: {problem}" if path else problem, path=path)


def unstorable_item(index: int, item: Any) -> InvalidInput | None:
    """The 422 of item ``index`` of a :data:`PER_ITEM_ROUTES` body (path ``items.<index>...``) when it
    holds text PostgreSQL cannot store, else None."""
    found = find_unstorable(item, f"items.{index}")
    return unstorable(found) if found else None
