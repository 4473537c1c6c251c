"""Gangs through the service on real PostgreSQL: all members or none, quota charged and refunded for
every member, a lost race on one member rolls back the others and replans."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.config import CapacityConfig
from app.capacity.placing.inline import Pending, Placed, place_inline
from app.capacity.planning.snapshot import PoolCache
from app.capacity.reservations.create import create_reservation
from app.capacity.reservations.release import release_reservation
from app.inventory import service as inventory
from app.placement.model import DeviceRequest, Gang, PlacementRequest
from app.placement.options import SchedulerOptions
from app.placement.request import ReservationRequest
from tests.capacity.helpers import (
    day_after,
    db_time,
    held_now,
    make_pool_with_nodes,
    node_body,
    reservation_row,
)


def _racks() -> list[Any]:
    return [
        node_body(name, 4, cpu=16, labels={"rack": rack})
        for name, rack in (("ga1", "a"), ("ga2", "a"), ("gb1", "b"), ("gb2", "b"), ("gb3", "b"))
    ]


async def _scalar(engine: AsyncEngine, sql: str) -> Any:
    async with engine.connect() as conn:
        return (await conn.execute(sa.text(sql))).scalar_one()


async def test_a_gang_is_placed_whole_and_released_whole(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, views = await make_pool_with_nodes(engine, _racks())
    by_name = {v.name: v.id for v in views}
    body = ReservationRequest.model_validate(
        {
            "tenantId": "acme",
            "poolId": pool,
            "devices": [{"class": "gpu", "count": 4}],
            "resources": {"cpu": 2},
            "duration": "1h",
            "gang": {"members": 3, "topologyKey": "rack"},
            "idempotencyKey": "gang-1",
        }
    )
    view, _ = await create_reservation(engine, PoolCache(), CapacityConfig(SchedulerOptions()), body)
    assert view.status == "placed" and len(view.allocations) == 3
    assert {a.nodeId for a in view.allocations} == {by_name[n] for n in ("gb1", "gb2", "gb3")}
    assert await _scalar(engine, "SELECT count(*) FROM device_bookings") == 12
    assert await held_now(engine, "quota_holdings", "resource = 'gpu'") == 12
    assert await held_now(engine, "quota_holdings", "resource = 'cpu'") == 6
    # a second gang of 3 cannot fit in rack a (2 nodes): pending, and nothing is held
    again = body.model_copy(update={"idempotencyKey": "gang-2"})
    pending, _ = await create_reservation(engine, PoolCache(), CapacityConfig(SchedulerOptions()), again)
    assert pending.status == "pending"
    assert pending.conditions[0].message.endswith(
        "gang: 3 members need 3 nodes with the same rack, 2 fit (best rack=a: 2)"
    )
    released = await release_reservation(engine, view.id, None)
    assert released.status == "released"
    # cut at the release instant: nothing is booked or held from then on
    assert await _scalar(engine, "SELECT count(*) FROM device_bookings WHERE upper(during) > now()") == 0
    assert await held_now(engine, "quota_holdings") == 0
    assert await held_now(engine, "scalar_holdings") == 0


async def test_a_lost_race_on_one_member_rolls_back_the_others(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, views = await make_pool_with_nodes(engine, _racks())
    by_name = {v.name: v.id for v in views}
    start = await db_time(engine)
    request = PlacementRequest(
        "acme", pool, (DeviceRequest("gpu", 2),), start=start, end=day_after(start), gang=Gang(2, "rack")
    )
    seen: list[int] = []

    cordoned: list[str] = []

    async def cordon_a_member(attempt: int, candidate: Any) -> None:
        seen.append(attempt)
        if attempt == 1:  # one member's node goes away between plan and commit
            cordoned.append(candidate.node_id)
            async with engine.begin() as other:
                await inventory.set_cordon(other, candidate.node_id, True)

    async with engine.begin() as conn:
        res = await reservation_row(conn, pool)
        outcome = await place_inline(
            conn, PoolCache(), request, res, SchedulerOptions(), 3, before_commit=cordon_a_member
        )
        written = (
            (
                await conn.execute(
                    sa.text("SELECT node_id FROM allocations WHERE reservation_id = :r"), {"r": res}
                )
            )
            .scalars()
            .all()
        )
    assert isinstance(outcome, Placed) and seen == [1, 2]
    placed_on = {a.node_id for a in outcome.allocations}
    assert cordoned[0] not in placed_on and len(placed_on) == 2
    assert {by_name[n] for n in ("ga1", "ga2")}.isdisjoint(placed_on)  # rack a lost a member: rack b
    assert sorted(written) == sorted(placed_on)  # nothing of attempt 1 survived the rollback
    assert not isinstance(outcome, Pending)
