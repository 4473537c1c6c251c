"""Which of a reservation's allocations count for people (docs/cli.md), and the
node names to look up for them: pure functions of the service's answers, used by the tables
(:mod:`app.client.render`) and the name lookups (:mod:`app.client.reservation_commands`).

A reservation's answer lists every allocation it ever had: one a repair or a drain's reschedule moved
away stays as history, cut at the move (docs/lifecycle.md, "BookingRepair"). A table counts the current
ones only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any


def current_allocations(reservation: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The allocations that hold the reservation's work, or held it last: the ones not released; once
    none is (released, preempted), the ones cut at the latest instant. An allocation a repair or a
    drain's reschedule moved away stays in the answer as history, cut at the move (docs/lifecycle.md,
    "BookingRepair"), and is left out here, as is everything of a reservation waiting again."""
    allocations: list[Mapping[str, Any]] = reservation.get("allocations") or []
    live = [a for a in allocations if not a.get("releasedAt")]
    if live or not allocations or reservation.get("status") in ("pending", "queued"):
        return live
    last = max(datetime.fromisoformat(a["releasedAt"]) for a in allocations)
    return [a for a in allocations if datetime.fromisoformat(a["releasedAt"]) == last]


def reservation_nodes(
    reservations: Iterable[Mapping[str, Any]], current: bool = False
) -> dict[str, set[str]]:
    """``{pool id: node ids}`` the reservations' allocations use (the names to look up); ``current``:
    only their :func:`current_allocations`."""
    wanted: dict[str, set[str]] = {}
    for r in reservations:
        for a in current_allocations(r) if current else r.get("allocations", []):
            wanted.setdefault(r["poolId"], set()).add(a["nodeId"])
    return wanted


def held_windows(
    reservations: Iterable[Mapping[str, Any]], node_ids: set[str], current: bool = False
) -> dict[tuple[str, str], tuple[datetime, datetime]]:
    """``{(tenant id, pool id): (first start, last end)}`` over the allocations on ``node_ids`` that
    held something (their window up to the release; one cut before its start held nothing): the
    period in which usage by node names those nodes (``current``: only :func:`current_allocations`)."""
    spans: dict[tuple[str, str], tuple[datetime, datetime]] = {}
    for r in reservations:
        for a in current_allocations(r) if current else r.get("allocations", []):
            if a["nodeId"] not in node_ids:
                continue
            start, end = datetime.fromisoformat(a["start"]), datetime.fromisoformat(a["end"])
            if a.get("releasedAt"):
                end = min(end, datetime.fromisoformat(a["releasedAt"]))
            if end <= start:
                continue
            key = (r["tenantId"], r["poolId"])
            first, last = spans.get(key, (start, end))
            spans[key] = (min(first, start), max(last, end))
    return spans
