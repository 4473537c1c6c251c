"""Two ``start: "earliest"`` creates racing for one earliest window (docs/lifecycle.md, "Earliest start"):
both plan the same window before either commits; the guarded commit lets one book it, the other searches
again and lands on the next window, and the invariants' sweep finds no double booking."""

from __future__ import annotations

import asyncio
from decimal import Decimal

from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.config import CapacityConfig
from app.capacity.planning.snapshot import PoolCache
from app.capacity.reservations.create import create_reservation
from app.placement.model import Candidate
from app.placement.options import SchedulerOptions
from app.placement.request import ReservationRequest
from app.quota.limits import set_limits
from tests.capacity.helpers import make_pool_with_nodes
from tests.capacity.invariants import violations
from tests.factories import node_body


def _body(pool: str, key: str, gpus: int, start: str | None = "earliest") -> ReservationRequest:
    return ReservationRequest.model_validate(
        {
            "tenantId": "acme",
            "poolId": pool,
            "devices": [{"class": "gpu", "count": gpus}],
            "duration": "1h",
            "start": start,
            "idempotencyKey": key,
        }
    )


async def test_two_earliest_creates_never_double_book_one_window(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body("race", 8)])
    config = CapacityConfig(SchedulerOptions())
    first, _ = await create_reservation(engine, PoolCache(), config, _body(pool, "held", 4, start=None))
    held_end = first.allocations[0].end

    both_planned = asyncio.Barrier(2)
    planned: list[str] = []

    async def hold_open(attempt: int, candidate: Candidate) -> None:
        planned.append(candidate.node_id)
        if len(planned) <= 2:  # the first plan of each: wait until both planned the same window
            await asyncio.wait_for(both_planned.wait(), timeout=20)

    async def one(key: str) -> tuple[str, str]:
        # a cache each: two processes, so the assume step does not keep them apart; only the commit does
        view, _ = await create_reservation(
            engine, PoolCache(), config, _body(pool, key, 8), before_commit=hold_open
        )
        assert view.status == "placed", view
        return view.allocations[0].start, view.allocations[0].end

    windows = sorted(await asyncio.gather(one("a"), one("b")))
    assert len(planned) == 3  # both planned the first window; the loser searched again and planned once more
    assert windows[0][0] == held_end  # the winner took the earliest window
    assert windows[1][0] == windows[0][1]  # the loser the next one, right after it
    assert await violations(engine) == {}


async def test_an_earliest_create_whose_charge_its_own_tenant_took_meanwhile_searches_again(
    clean_db: AsyncEngine,
) -> None:
    """Two earliest creates of one tenant with a GPU quota of 8, on two nodes: both plan 8 GPUs now (one
    node each), the first commits its charge, the second's charge is refused at commit; it searches
    again and lands where the quota holds, after the first's window, instead of answering 409."""
    engine = clean_db
    pool, _ = await make_pool_with_nodes(
        engine, [node_body("q1", 8, labels={"rack": "r1"}), node_body("q2", 8, labels={"rack": "r2"})]
    )
    async with engine.begin() as conn:
        await set_limits(conn, "acme", pool, {"gpu": Decimal(8)})
    config = CapacityConfig(SchedulerOptions())
    both_planned = asyncio.Barrier(2)
    planned: list[str] = []

    async def hold_open(attempt: int, candidate: Candidate) -> None:
        planned.append(candidate.node_id)
        if len(planned) <= 2:
            await asyncio.wait_for(both_planned.wait(), timeout=20)

    async def one(key: str, rack: str) -> tuple[str, str]:
        body = _body(pool, key, 8).model_dump(by_alias=True, mode="json", exclude_none=True)
        body["devices"][0]["selector"] = f"rack={rack}"
        request = ReservationRequest.model_validate({**body, "idempotencyKey": key})
        view, _ = await create_reservation(engine, PoolCache(), config, request, before_commit=hold_open)
        assert view.status == "placed", view
        return view.allocations[0].start, view.allocations[0].end

    windows = sorted(await asyncio.gather(one("a", "r1"), one("b", "r2")))
    assert len(planned) == 3  # the refused one searched again and planned once more
    assert windows[1][0] == windows[0][1]  # placed where the quota holds: right after the first's window
    assert await violations(engine) == {}
