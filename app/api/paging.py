"""Opaque list cursors: ``limit`` and ``cursor`` in, ``items`` and ``nextCursor`` out (docs/api.md).

A cursor is the sort key of the last item of a page, tagged with the list it belongs to, as URL-safe
base64 of a JSON array: ``["reservations", "2026-12-01T12:00:00+00:00", "res_01k..."]``. Clients must
not build or read them; a cursor that this API did not issue for this list is 422 INVALID_INPUT naming
``cursor``. Pages continue after the key (keyset paging), so an item added or removed meanwhile neither
repeats nor hides another.

Cursors are not signed (any replica must read any other's, and a per-process secret would not let it):
:func:`decode_cursor` is the one place their contents are checked instead. The key's parts must be
strings PostgreSQL can store (no NUL, no lone surrogate: a forged ``["nodes", "\\u0000"]`` once reached
the database and answered 500), and ``order`` (e.g. :func:`time_then_id`) must read them (an aware time
that has a UTC equivalent); anything else is the same 422.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from fastapi import Query

from app.api.text_guard import find_unstorable
from app.errors import InvalidInput

T = TypeVar("T")

# a list's query parameters, as route parameters: ``limit: PageLimit = 100, cursor: PageCursor = None``
PageLimit = Annotated[int, Query(ge=1, le=1000)]
PageCursor = Annotated[str | None, Query(max_length=512, description="The previous page's `nextCursor`.")]


def encode_cursor(kind: str, *key: str) -> str:
    """The cursor after an item whose sort key is ``key`` in the list ``kind``."""
    raw = json.dumps([kind, *key], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _not_a_cursor(kind: str) -> InvalidInput:
    return InvalidInput(f"cursor: not a cursor of this list ({kind})", path="cursor")


def decode_cursor(cursor: str, kind: str, size: int) -> tuple[str, ...]:
    """The ``size`` strings of the sort key in ``cursor``; raises InvalidInput (path ``cursor``) for a
    cursor not issued for the list ``kind``: not base64 JSON, another list's, another length, a part
    that is not a string or holds text PostgreSQL cannot store."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
    except (binascii.Error, ValueError):
        data = None
    if (
        not isinstance(data, list)
        or len(data) != size + 1
        or data[0] != kind
        or not all(isinstance(part, str) for part in data[1:])
        or find_unstorable(data[1:]) is not None
    ):
        raise _not_a_cursor(kind)
    return tuple(data[1:])


def next_cursor(kind: str, following: str | Sequence[str] | None) -> str | None:
    """The ``nextCursor`` of a page of the list ``kind``: the cursor after ``following``, the sort key (one
    string or a tuple of strings) of the page's last item when more remain; None on the last page."""
    if following is None:
        return None
    key = (following,) if isinstance(following, str) else tuple(following)
    return encode_cursor(kind, *key)


def page_after(
    items: Sequence[T],
    kind: str,
    key: Callable[[T], tuple[str, ...]],
    order: Callable[[tuple[str, ...]], Any],
    limit: int,
    cursor: str | None,
) -> dict[str, Any]:
    """``{items, nextCursor}``: up to ``limit`` of ``items`` (sorted ascending by ``order(key(item))``)
    after the cursor's key; for lists read whole (pools). ``order`` turns a key's strings into a
    comparable value (e.g. a parsed time); a cursor it cannot read is InvalidInput naming ``cursor``."""
    rest = list(items)
    if cursor is not None:
        after = cursor_key(cursor, kind, order)
        rest = [item for item in rest if order(key(item)) > after]
    page = rest[:limit]
    more = len(rest) > limit
    return {"items": page, "nextCursor": encode_cursor(kind, *key(page[-1])) if more else None}


def time_then_id(key: tuple[str, ...]) -> tuple[datetime, str]:
    """The order of a ``(createdAt, id)`` key: the aware time in UTC, then the id; ValueError for a time
    without an offset or one with no UTC equivalent (``0001-01-01T00:00:00+01:00``)."""
    created = datetime.fromisoformat(key[0])
    if created.tzinfo is None:
        raise ValueError("a cursor's time carries its offset")
    try:
        return created.astimezone(UTC), key[1]
    except OverflowError:
        raise ValueError("a cursor's time is out of range") from None


def created_after(cursor: str | None, kind: str) -> tuple[datetime, str] | None:
    """The ``(createdAt, id)`` key a page of the list ``kind`` starts after (:func:`time_then_id`);
    None for the first page (no cursor). InvalidInput naming ``cursor`` when unreadable."""
    return None if cursor is None else cursor_key(cursor, kind, time_then_id)


def cursor_key(cursor: str, kind: str, order: Callable[[tuple[str, ...]], Any], size: int = 2) -> Any:
    """``order`` of the cursor's key (``size`` strings); InvalidInput naming ``cursor`` when unreadable."""
    parts = decode_cursor(cursor, kind, size)
    try:
        return order(parts)
    except ValueError:
        raise _not_a_cursor(kind) from None
