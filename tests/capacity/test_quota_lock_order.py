"""The tenant's quota row is locked by the guarded commit, last, and not over the plan (issue 15: with
32 clients of one tenant the quota row serialized whole reserves). Checked with real row locks from a
second connection (``FOR UPDATE NOWAIT``: 55P03 when another transaction holds the row), no timing."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.commit.shapes import CommitExtras, QuotaCharge
from app.capacity.placing.inline import Placed, place_inline
from app.capacity.planning.snapshot import PoolCache
from app.db.tables import quota_holdings, quota_usage
from app.db.tx import sqlstate
from app.placement.model import DeviceRequest, PlacementRequest
from app.placement.options import SchedulerOptions
from app.quota.limits import set_limits
from tests.capacity.helpers import db_time, make_pool_with_nodes, node_body, reservation_row

LOCK_NOT_AVAILABLE = "55P03"


async def _quota_row_free(engine: AsyncEngine, pool: str) -> bool:
    """Can another transaction lock the tenant's gpu quota row right now?"""
    async with engine.begin() as other:
        try:
            # SELECT 1 FROM quota_usage WHERE tenant_id = 'acme' AND pool_id = :pool AND resource = 'gpu'
            #  FOR UPDATE NOWAIT
            await other.execute(
                sa.select(sa.literal(1))
                .select_from(quota_usage)
                .where(
                    quota_usage.c.tenant_id == "acme",
                    quota_usage.c.pool_id == pool,
                    quota_usage.c.resource == "gpu",
                )
                .with_for_update(nowait=True)
            )
        except DBAPIError as exc:
            assert sqlstate(exc) == LOCK_NOT_AVAILABLE, exc
            return False
    return True


async def test_the_quota_row_is_locked_by_the_commit_not_over_the_plan(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body(f"q{i}", 8) for i in range(3)])
    async with engine.begin() as conn:
        await set_limits(conn, "acme", pool, {"gpu": Decimal(16)})
    start = await db_time(engine)
    request = PlacementRequest(
        "acme", pool, (DeviceRequest("gpu", 2),), start=start, end=start + timedelta(hours=1)
    )
    seen: list[bool] = []

    async def between_plan_and_commit(attempt: int, candidate: Any) -> None:
        seen.append(await _quota_row_free(engine, pool))

    async with engine.begin() as conn:
        res = await reservation_row(conn, pool)
        charge = QuotaCharge("acme", pool, res, {"gpu": Decimal(2)}, request.start, request.end)
        outcome = await place_inline(
            conn,
            PoolCache(),
            request,
            res,
            SchedulerOptions(),
            3,
            before_commit=between_plan_and_commit,
            extras=CommitExtras(charge=charge),
        )
        assert isinstance(outcome, Placed), outcome
        assert seen == [True]  # the plan ran without the quota row
        assert not await _quota_row_free(engine, pool)  # the commit holds it, to COMMIT
        held = (
            await conn.execute(
                sa.select(quota_holdings.c.amount).where(quota_holdings.c.reservation_id == res)
            )
        ).scalar_one()
        assert held == 2
    assert await _quota_row_free(engine, pool)
