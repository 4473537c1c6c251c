"""Hello, heartbeats, the liveness sweep and placements racing for real (many connections, one
PostgreSQL): no deadlock or error, the rollup stays equal to the device rows, no atom that left at a Hello
committed before a placement is booked by it, and a node's reasons always match its conditions."""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.config import CapacityConfig
from app.capacity.planning.snapshot import PoolCache
from app.capacity.reservations.create import create_reservation
from app.db.tables import allocations, devices, nodes, pool_capacity_rollup
from app.inventory import service as inventory
from app.inventory.hello import heartbeat, hello
from app.inventory.liveness import sweep_heartbeats
from app.inventory.schemas import HeartbeatBody, HelloBody
from app.placement.options import SchedulerOptions
from app.placement.request import ReservationRequest
from tests.agent_host import h200_host

NODES = 8


def _hello(pool: str, i: int, gpus: int) -> HelloBody:
    topo, xml = h200_host(gpus)
    return HelloBody(
        poolId=pool,
        name=f"n{i}",
        topo=topo,
        nvidiaSmiXml=xml.replace("GPU-00000000-", f"GPU-{i:08d}-"),
        capabilities=["devices.limits"],
        intervalSeconds=1,
    )


async def test_hellos_and_placements_race_without_errors(clean_db: AsyncEngine) -> None:
    engine = clean_db
    async with engine.begin() as conn:
        pool = (await inventory.create_pool(conn, "race")).id
    # every node registers at once (creates), then shrinks and grows while placements run
    await asyncio.gather(*(hello(engine, _hello(pool, i, 2)) for i in range(NODES)))
    cache, config = PoolCache(), CapacityConfig(options=SchedulerOptions())
    rng = random.Random(14)

    async def place(k: int) -> str:
        body = ReservationRequest.model_validate(
            {
                "tenantId": "acme",
                "poolId": pool,
                "devices": [{"class": "gpu", "count": 1}],
                "duration": "1h",
                "idempotencyKey": f"r{k}",
            }
        )
        view, _ = await create_reservation(engine, cache, config, body)
        return view.status

    jobs = [hello(engine, _hello(pool, i, rng.choice((1, 2)))) for i in range(NODES) for _ in range(3)]
    jobs += [place(k) for k in range(24)]
    rng.shuffle(jobs)
    results = await asyncio.gather(*jobs)
    assert {r for r in results if isinstance(r, str)} <= {"placed", "pending"}

    async with engine.connect() as conn:
        count = (await conn.execute(sa.select(sa.func.count()).select_from(devices))).scalar_one()
        total = (await conn.execute(sa.select(pool_capacity_rollup.c.total))).scalar_one()
        assert count == total == 2 * NODES  # devices that left are kept, never deleted

    # every node shrinks to one GPU while a new wave places: no placement books a device that had left
    before = set(await _allocation_ids(engine))
    wave = [hello(engine, _hello(pool, i, 1)) for i in range(NODES)] + [place(100 + k) for k in range(16)]
    rng.shuffle(wave)
    await asyncio.gather(*wave)
    async with engine.connect() as conn:
        shrunk = (await conn.execute(sa.select(nodes.c.id))).scalars().all()
        assert len(shrunk) == NODES
        rows = (
            await conn.execute(sa.select(allocations.c.id, allocations.c.atoms, allocations.c.created_at))
        ).all()
        left_at = {
            r.id: r.bookable for r in (await conn.execute(sa.select(devices.c.id, devices.c.bookable))).all()
        }
    assert sum(not b for b in left_at.values()) == NODES  # each node's second GPU left
    # an allocation of the last wave may hold a second GPU only if it committed before that node's Hello;
    # then that Hello reported it to the repair hook. Either way the device row is kept.
    assert all(atom in left_at for r in rows for atom in r.atoms)
    assert len(rows) - len(before) <= 16
    # once the Hellos committed, nothing books a device that left
    after = set(await _allocation_ids(engine))
    for k in range(8):
        await place(200 + k)
    async with engine.connect() as conn:
        fresh = (
            (await conn.execute(sa.select(allocations.c.atoms).where(allocations.c.id.not_in(list(after)))))
            .scalars()
            .all()
        )
    assert all(left_at[atom] for atoms in fresh for atom in atoms)


async def _allocation_ids(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        return list((await conn.execute(sa.select(allocations.c.id))).scalars().all())


async def test_heartbeats_and_sweeps_race_and_reasons_match_conditions(clean_db: AsyncEngine) -> None:
    engine = clean_db
    async with engine.begin() as conn:
        pool = (await inventory.create_pool(conn, "beat")).id
    ids = [(await hello(engine, _hello(pool, i, 1))).view.id for i in range(NODES)]
    async with engine.connect() as conn:
        later = (await conn.exec_driver_sql("SELECT now()")).scalar_one() + timedelta(hours=1)

    async def sweep() -> int:
        async with engine.begin() as conn:
            return await sweep_heartbeats(conn, later)

    def allow(_pool: str) -> None:
        return None

    rng = random.Random(7)
    for _ in range(5):
        jobs = [heartbeat(engine, n, HeartbeatBody(devices=[]), allow) for n in ids for _ in range(3)]
        jobs += [sweep() for _ in range(4)]
        rng.shuffle(jobs)
        await asyncio.gather(*jobs)
        async with engine.connect() as conn:
            for lost, reasons in (
                await conn.execute(sa.select(nodes.c.heartbeat_lost, nodes.c.no_schedule_reasons))
            ).all():
                assert reasons == (["heartbeat lost"] if lost else [])


async def test_the_same_first_hello_six_times_at_once_creates_one_node(clean_db: AsyncEngine) -> None:
    engine = clean_db
    async with engine.begin() as conn:
        pool = (await inventory.create_pool(conn, "twice")).id
    outcomes = await asyncio.gather(*(hello(engine, _hello(pool, 0, 2)) for _ in range(6)))
    assert sum(o.created for o in outcomes) == 1
    assert len({o.view.id for o in outcomes}) == 1
    async with engine.connect() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(nodes))).scalar_one() == 1
        assert (await conn.execute(sa.select(pool_capacity_rollup.c.total))).scalar_one() == 2
