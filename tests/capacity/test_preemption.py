"""Spot preemption on real PostgreSQL (issue 13, "Done when" 1, 2, 3, 5, 6 and the races): through the
reservations service, and the guarded statements of app/capacity/placing/preemption.py raced on purpose."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.answers.reservations import Reservation
from app.capacity.commit.lost_races import ATOM_BOOKED, LostRace
from app.capacity.config import CapacityConfig
from app.capacity.placing import preemption
from app.capacity.planning.snapshot import PoolCache
from app.capacity.requests import placement_request
from app.capacity.reservations.create import create_reservation
from app.capacity.reservations.preview import preview
from app.capacity.reservations.reads import get_reservation
from app.capacity.reservations.release import release_reservation
from app.inventory import service as inventory
from app.placement.options import SchedulerOptions
from app.placement.request import ReservationRequest
from app.quota.limits import set_limits
from tests.capacity.helpers import (
    held_now,
    make_pool_with_nodes,
    node_body,
    overlapping_bookings,
    reservation_row,
)

CONFIG = CapacityConfig(SchedulerOptions())
_keys = iter(range(1_000_000))


def body(
    pool: str, gpus: int, *, spot: bool = False, tenant: str = "acme", **extra: Any
) -> ReservationRequest:
    devices = (
        [{"class": "gpu", "count": gpus, **({"topology": "nvlink-all"} if gpus == 8 else {})}] if gpus else []
    )
    return ReservationRequest.model_validate(
        {
            "tenantId": tenant,
            "poolId": pool,
            "devices": devices,
            "duration": "1d",
            "spot": spot,
            "idempotencyKey": f"k{next(_keys)}",
            **extra,
        }
    )


async def reserve(engine: AsyncEngine, cache: PoolCache, b: ReservationRequest) -> Reservation:
    view, _ = await create_reservation(engine, cache, CONFIG, b)
    return view


async def fill(
    engine: AsyncEngine,
    cache: PoolCache,
    pool: str,
    node_name: str,
    shapes: list[int],
    tenant: str,
    spot: bool = True,
) -> list[Reservation]:
    """Add node ``node_name`` (8 NVLinked GPUs) and fill it with spot reservations of ``shapes`` GPUs."""
    async with engine.begin() as conn:
        await inventory.add_node(conn, pool, node_body(node_name, 8))
    placed = [await reserve(engine, cache, body(pool, n, spot=spot, tenant=tenant)) for n in shapes]
    assert all(v.status == "placed" for v in placed)
    return placed


async def scalar(engine: AsyncEngine, sql: str, **params: Any) -> Any:
    async with engine.connect() as conn:
        return (await conn.execute(sa.text(sql), params)).scalar_one()


async def spot_pool(engine: AsyncEngine, cache: PoolCache) -> tuple[str, dict[str, list[Reservation]]]:
    """A pool full of spot work: node a 8 x 1 GPU, node b 2 x 4 GPUs, node c 4 x 2 GPUs (tenants spotco
    and acme mixed on b)."""
    pool, _ = await make_pool_with_nodes(engine, [])
    work = {
        "a": await fill(engine, cache, pool, "a", [1] * 8, "spotco"),
        "b": await fill(engine, cache, pool, "b", [4], "spotco")
        + await fill_more(engine, cache, pool, [4], "acme"),
        "c": await fill(engine, cache, pool, "c", [2] * 4, "spotco"),
    }
    return pool, work


async def fill_more(
    engine: AsyncEngine, cache: PoolCache, pool: str, shapes: list[int], tenant: str
) -> list[Reservation]:
    placed = [await reserve(engine, cache, body(pool, n, spot=True, tenant=tenant)) for n in shapes]
    assert all(v.status == "placed" for v in placed)
    return placed


async def test_a_regular_request_preempts_the_fewest_spot_reservations(clean_db: AsyncEngine) -> None:
    engine, cache = clean_db, PoolCache()
    pool, work = await spot_pool(engine, cache)
    async with engine.begin() as conn:
        await set_limits(conn, "spotco", pool, {})  # counted, not limited
    node_b = work["b"][0].allocations[0].nodeId
    spot_gpus_before = await held_now(engine, "quota_holdings", "resource = 'gpu' AND tenant_id = 'spotco'")
    assert spot_gpus_before == 8 + 4 + 8

    seen = await preview(engine, cache, CONFIG, body(pool, 8))  # done when 2: before the reserve
    assert seen.fits is False and seen.candidates == []
    pre = seen.preemptible
    assert pre.reservations == 2 and pre.candidates[0].nodeId == node_b
    assert pre.candidates[0].victims == 2
    assert pre.startsAt
    # ids only for the request's tenant (acme); spotco's victim is counted, never named
    assert pre.reservationIds == [work["b"][1].id] and pre.hiddenReservations == 1

    view = await reserve(engine, cache, body(pool, 8))
    assert view.status == "placed"
    assert [a.nodeId for a in view.allocations] == [pre.candidates[0].nodeId]
    cond = view.conditions[0]
    assert cond.type == "Preempted" and cond.reason == preemption.PREEMPTOR_REASON
    assert cond.reservationIds == [work["b"][1].id] and cond.hiddenReservations == 1

    async with engine.connect() as conn:
        for victim in work["b"]:
            got = await get_reservation(conn, victim.id, None)
            assert got.status == "preempted"
            assert got.conditions[-1].type == "Preempted" and got.conditions[-1].at
            assert got.allocations[0].releasedAt is not None  # what it held, cut at the instant
            assert got.allocations[0].atoms == victim.allocations[0].atoms
        for other in work["a"] + work["c"]:
            assert (await get_reservation(conn, other.id, None)).status == "placed"
        assert await overlapping_bookings(conn) == 0
    # the victims' windows are cut at the preemption instant: nothing of theirs holds after it
    victims = [v.id for v in work["b"]]
    assert (
        await scalar(
            engine,
            """SELECT count(*) FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id
                WHERE a.reservation_id = ANY(:ids) AND upper(b.during) > a.released_at""",
            ids=victims,
        )
        == 0
    )
    # quota refunded for the remainder: spotco now holds node a's and c's work only
    assert await held_now(engine, "quota_holdings", "resource = 'gpu' AND tenant_id = 'spotco'") == 16
    assert await held_now(engine, "quota_holdings", "resource = 'gpu' AND tenant_id = 'acme'") == 8
    # releasing a preempted reservation is a no-op
    again = await release_reservation(engine, victims[0], None)
    assert again.status == "preempted"


async def test_spot_never_preempts_spot_and_regular_never_preempts_regular(clean_db: AsyncEngine) -> None:
    engine, cache = clean_db, PoolCache()
    pool, _ = await make_pool_with_nodes(engine, [])
    await fill(engine, cache, pool, "s", [4, 4], "spotco")
    as_spot = await reserve(engine, cache, body(pool, 8, spot=True))
    assert as_spot.status == "pending"
    seen = await preview(engine, cache, CONFIG, body(pool, 8, spot=True))
    assert seen.fits is False and seen.preemptible is None

    regular_pool, _ = await make_pool_with_nodes(engine, [])
    await fill(engine, cache, regular_pool, "r", [4, 4], "acme", spot=False)
    regular = await reserve(engine, cache, body(regular_pool, 8))
    assert regular.status == "pending"
    seen = await preview(engine, cache, CONFIG, body(regular_pool, 8))
    assert seen.preemptible is None
    assert await scalar(engine, "SELECT count(*) FROM reservations WHERE status = 'preempted'") == 0


async def test_preemption_off_keeps_the_request_pending(clean_db: AsyncEngine) -> None:
    engine, cache = clean_db, PoolCache()
    pool, _ = await make_pool_with_nodes(engine, [])
    await fill(engine, cache, pool, "s", [4, 4], "spotco")
    off = CapacityConfig(SchedulerOptions(), preemption=False)
    view, _ = await create_reservation(engine, cache, off, body(pool, 8))
    assert view.status == "pending"
    assert (await preview(engine, cache, off, body(pool, 8))).preemptible is None


async def test_a_gang_that_needs_victims_on_two_nodes_evicts_on_both(clean_db: AsyncEngine) -> None:
    engine, cache = clean_db, PoolCache()
    pool, _ = await make_pool_with_nodes(engine, [])
    a = await fill(engine, cache, pool, "a", [4, 2, 2], "spotco")
    b = await fill(engine, cache, pool, "b", [4, 4], "spotco")
    gang = body(pool, 4, gang={"members": 2})
    view = await reserve(engine, cache, gang)
    assert view.status == "placed" and len({x.nodeId for x in view.allocations}) == 2
    async with engine.connect() as conn:
        statuses = {v.id: (await get_reservation(conn, v.id, None)).status for v in a + b}
        assert await overlapping_bookings(conn) == 0
    # one 4-GPU victim on each node (the fewest), the 2-GPU ones kept
    assert statuses[a[0].id] == "preempted" and [statuses[b[0].id], statuses[b[1].id]].count("preempted") == 1
    assert statuses[a[1].id] == statuses[a[2].id] == "placed"


async def test_a_gang_member_that_loses_its_race_evicts_on_neither_node(clean_db: AsyncEngine) -> None:
    engine, cache = clean_db, PoolCache()
    pool, views = await make_pool_with_nodes(engine, [node_body("a", 4), node_body("b", 4)])
    work = [await reserve(engine, cache, body(pool, 4, spot=True)) for _ in range(2)]
    gang = body(pool, 4, gang={"members": 2})
    async with engine.begin() as conn:
        now = (await conn.exec_driver_sql("SELECT now()")).scalar_one()
        request = placement_request(CONFIG, gang, now)
        plan = await preemption.plan_with_preemption(conn, cache, request, CONFIG.options, now)
        assert plan is not None and len(plan.victims) == 2
        # member b's node is cordoned (committed elsewhere) between the plan and the commit
        async with engine.begin() as other:
            await inventory.set_cordon(other, views[1].id, True)
        rid = await reservation_row(conn, pool)
        outcome = await preemption.commit_preemption(conn, request, plan, rid, 1, now)
        assert isinstance(outcome, LostRace) and "no longer schedulable" in outcome.reason
        # nothing of the eviction stays: neither victim is preempted, their bookings are whole
        got = (
            await conn.execute(sa.text("SELECT count(*) FROM reservations WHERE status = 'preempted'"))
        ).scalar_one()
        assert got == 0
    async with engine.connect() as conn:
        for w in work:
            assert (await get_reservation(conn, w.id, None)).status == "placed"
    assert (
        await scalar(
            engine, "SELECT count(*) FROM device_bookings WHERE upper(during) > now() + interval '1 hour'"
        )
        == 8
    )


async def test_a_victim_released_meanwhile_is_a_lost_race_then_a_replan(clean_db: AsyncEngine) -> None:
    engine, cache = clean_db, PoolCache()
    pool, _ = await make_pool_with_nodes(engine, [node_body("a", 8)])
    v1, v2 = [await reserve(engine, cache, body(pool, 4, spot=True)) for _ in range(2)]
    async with engine.begin() as conn:
        now = (await conn.exec_driver_sql("SELECT now()")).scalar_one()
        request = placement_request(CONFIG, body(pool, 4), now)
        plan = await preemption.plan_with_preemption(conn, cache, request, CONFIG.options, now)
        assert plan is not None and len(plan.victims) == 1
        victim = plan.victims[0].reservation_id
        await release_reservation(engine, victim, None)  # another transaction, committed
        rid = await reservation_row(conn, pool)
        outcome = await preemption.commit_preemption(conn, request, plan, rid, 1, now)
        assert isinstance(outcome, LostRace) and outcome.kind == preemption.VICTIM_GONE
    async with engine.connect() as conn:
        assert (await get_reservation(conn, victim, None)).status == "released"  # never preempted
    # end to end, the replan takes the released GPUs: no victim needed any more
    view = await reserve(engine, cache, body(pool, 4))
    assert view.status == "placed" and view.conditions == []
    other = v2.id if victim == v1.id else v1.id
    async with engine.connect() as conn:
        assert (await get_reservation(conn, other, None)).status == "placed"


async def test_spot_work_booked_while_the_preemption_commits_is_caught(clean_db: AsyncEngine) -> None:
    engine, cache = clean_db, PoolCache()
    pool, _ = await make_pool_with_nodes(engine, [node_body("a", 8)])
    victim = await reserve(engine, cache, body(pool, 4, spot=True, tenant="spotco"))  # 4 GPUs free beside it
    async with engine.begin() as conn:
        now = (await conn.exec_driver_sql("SELECT now()")).scalar_one()
        request = placement_request(CONFIG, body(pool, 8), now)
        plan = await preemption.plan_with_preemption(conn, cache, request, CONFIG.options, now)
        assert plan is not None and [v.reservation_id for v in plan.victims] == [victim.id]
        late = await reserve(
            engine, PoolCache(), body(pool, 4, spot=True, tenant="spotco")
        )  # books the 4 free GPUs
        assert late.status == "placed"
        rid = await reservation_row(conn, pool)
        outcome = await preemption.commit_preemption(conn, request, plan, rid, 1, now)
        assert isinstance(outcome, LostRace) and outcome.kind == ATOM_BOOKED
    async with engine.connect() as conn:
        assert (await get_reservation(conn, victim.id, None)).status == "placed"  # rolled back
        assert await overlapping_bookings(conn) == 0
    # the service replans: both spot reservations go
    view = await reserve(engine, cache, body(pool, 8))
    assert view.status == "placed" and view.conditions[0].hiddenReservations == 2


async def test_a_whole_node_lease_preempts_every_spot_reservation_of_its_node(clean_db: AsyncEngine) -> None:
    engine, cache = clean_db, PoolCache()
    pool, _ = await make_pool_with_nodes(engine, [])
    work = await fill(engine, cache, pool, "l", [2, 2], "spotco")  # 4 GPUs free, 2 x 2 spot, cpu held
    async with engine.begin() as conn:
        await inventory.add_node(conn, pool, node_body("r", 8))
    regular = await reserve(engine, cache, body(pool, 8))  # node r: regular work, never a victim
    assert regular.status == "placed" and regular.conditions == []
    lease = await reserve(engine, cache, body(pool, 0, binding="node", resources={"cpu": 1}))
    assert lease.status == "placed", lease.conditions
    assert lease.allocations[0].nodeId == work[0].allocations[0].nodeId
    assert len(lease.allocations[0].atoms) == 8
    assert lease.conditions[0].hiddenReservations == 2
    async with engine.connect() as conn:
        assert {(await get_reservation(conn, w.id, None)).status for w in work} == {"preempted"}
        assert (await get_reservation(conn, regular.id, None)).status == "placed"
        assert await overlapping_bookings(conn) == 0
