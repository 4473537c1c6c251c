"""The ``start: "earliest"`` placer (docs/lifecycle.md, "Earliest start"): search the earliest window
(:func:`app.capacity.planning.earliest.find_earliest`), then place the request at that window through the
inline placer's guarded commit (:func:`app.capacity.placing.inline.place_inline`), the quota charge and
the placed mark riding on it for that window.

A commit that loses its race (or a plan at the found start that no longer fits: someone committed there
between the search and the plan) searches again from the requested start, at most
``BC_CAPACITY_MAX_ATTEMPTS`` times in all, each attempt one guarded commit. Two creates racing for one
window therefore never both book it (the guarded statements and the exclusion constraint decide), and
the loser lands on the next window that fits, or is pending. So does a create whose charge the quota
refuses at commit because the tenant's own work committed at that window meanwhile (the search saw the
quota hold there): it searches again and lands where the quota holds; the last attempt's refusal is the
answer (409).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.commit.lost_races import unschedulable_after
from app.capacity.commit.shapes import CommitExtras, MarkPlaced, QuotaCharge
from app.capacity.config import CapacityConfig
from app.capacity.placing.inline import Pending, Placed, place_inline
from app.capacity.planning.earliest import NoWindow, find_earliest
from app.capacity.planning.snapshot import PoolCache, PoolHead
from app.capacity.requests import quota_amounts
from app.db.locks import PoolShare
from app.errors import QuotaExceeded
from app.placement.model import Candidate, PlacementRequest
from app.placement.request import deadline_passed


def waiting_reason(reason: str) -> str:
    """The pending reason of an earliest create that found no window: ``<why>; pending: placed for
    [now, now + duration) when a wake edge lets it fit``."""
    return f"{reason}; pending: placed for [now, now + duration) when a wake edge lets it fit"


def past_deadline(start: datetime, deadline: datetime) -> str:
    """Why an earliest window is not taken: ``earliest: the first window starts at <start>, at or after
    the deadline <deadline>``."""
    first, last = start.isoformat(), deadline.isoformat()
    return f"earliest: the first window starts at {first}, at or after the deadline {last}"


async def place_earliest(
    conn: AsyncConnection,
    cache: PoolCache,
    config: CapacityConfig,
    request: PlacementRequest,
    reservation_id: str,
    now: datetime,
    *,
    before_commit: Callable[[int, Candidate], Awaitable[None]] | None = None,
    head: PoolHead | None = None,
    pool_share: PoolShare | None = None,
    deadline: datetime | None = None,
) -> tuple[PlacementRequest, Placed | Pending]:
    """Place ``request`` at its earliest window within ``now + config.max_lead``, in the caller's
    transaction; answers the request as placed (moved to that window) and :class:`Placed`, or the
    request as given and :class:`Pending` (no window: :func:`waiting_reason`; every attempt lost:
    ``Unschedulable after <n> conflicting attempts: ...``; a window starting at or after ``deadline``:
    :func:`past_deadline`, docs/lifecycle.md "Deadlines"). Raises QuotaExceeded (the charge at the
    window of the last attempt was refused at commit; an earlier attempt's refusal searches again),
    NotFound (pool)."""
    lost: list[str] = []
    for attempt in range(1, config.max_attempts + 1):
        found = await find_earliest(conn, cache, config, request, now, head=head if attempt == 1 else None)
        if isinstance(found, NoWindow):
            return request, Pending(waiting_reason(found.reason))
        moved = found.request
        assert moved.start is not None and moved.end is not None
        if deadline_passed(deadline, moved.start):
            assert deadline is not None
            return request, Pending(waiting_reason(past_deadline(moved.start, deadline)))
        charge = QuotaCharge(
            moved.tenant_id, moved.pool_id, reservation_id, quota_amounts(moved), moved.start, moved.end
        )
        attempt_point = await conn.begin_nested()  # a refused charge leaves nothing of this attempt
        try:
            outcome = await place_inline(
                conn,
                cache,
                moved,
                reservation_id,
                config.options,
                1,  # one guarded commit per search: a lost race searches again
                config.shortlist_min,
                before_commit,
                extras=CommitExtras(charge, MarkPlaced(reservation_id, moved.end)),
                pool_share=pool_share,
            )
        except QuotaExceeded as refused:
            await attempt_point.rollback()
            if attempt == config.max_attempts:
                raise
            # the tenant's own work committed meanwhile took the quota at that window: search again
            lost.append(f"quota: {refused.message}")
            continue
        await attempt_point.commit()
        if isinstance(outcome, Placed):
            return moved, outcome
        # one attempt's answer names one lost race: the final answer lists each attempt's once
        lost.append(outcome.reason.removeprefix(unschedulable_after([""])))
    return request, Pending(unschedulable_after(lost))
