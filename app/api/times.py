"""Times in query parameters (``from``, ``to``): ISO 8601 text with a UTC offset, in the years a window
may lie in (docs/api.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BeforeValidator

from app.placement.request import FIRST_WINDOW_YEAR, LAST_WINDOW_YEAR, window_end


def _iso_time(value: object) -> object:
    """A query's time: ISO 8601 text with a UTC offset, in years 1970..9999 (not a number of seconds)."""
    if not isinstance(value, str):
        return value
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("not an ISO 8601 time, e.g. 2026-12-01T12:00:00Z") from None
    if parsed.tzinfo is None:
        raise ValueError("needs a UTC offset, e.g. 2026-12-01T12:00:00Z")
    if window_end(parsed, 0) is None:
        raise ValueError(f"must lie in years {FIRST_WINDOW_YEAR}..{LAST_WINDOW_YEAR} (UTC)")
    return parsed


# a route's time parameter: ``start: Annotated[IsoTime, Query(alias="from", description=...)] = None``
IsoTime = Annotated[datetime | None, BeforeValidator(_iso_time)]
