"""The pool row lock is taken right before the first commit, not before the plan (docs/lifecycle.md,
"Lock order"; docs/placement-rules.md, "The pipeline": the critical section is the commit alone), on
real PostgreSQL.

A create (and a batch) paused between its plan and its commit holds nothing of the pool but the
foreign key's ``FOR KEY SHARE`` of its reservation row, so a node add, a label change and an archive on
another connection go through; a pool archived there answers exactly as a pool archived before the
create, and nothing is written. Every inventory change below runs with ``lock_timeout`` set, so a change
that had to wait for the open plan fails with ``55P03`` instead of hanging the test.
"""

from __future__ import annotations

import asyncio
import random
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.answers.inventory import Node
from app.answers.reservations import Reservation
from app.capacity.config import CapacityConfig
from app.capacity.placing.batch import BatchEntry, BatchOptions, place_batch
from app.capacity.placing.inline import Pending, Placed
from app.capacity.planning.snapshot import PoolCache
from app.capacity.reservations.create import create_reservation
from app.db.tables import allocations, device_bookings, nodes, quota_holdings, scalar_holdings
from app.inventory import service as inventory
from app.placement.model import Candidate, DeviceRequest, PlacementRequest
from app.placement.options import SchedulerOptions
from app.placement.request import ReservationRequest
from app.placement.summary import ARCHIVED_POOL
from tests.capacity.helpers import day_after, db_time, make_pool_with_nodes, node_body, reservation_row

# a change that had to wait for the open plan fails with 55P03 (lock_not_available) after this
NOT_BLOCKED = "SET LOCAL lock_timeout = '3s'"


def _body(pool: str, key: str, gpus: int = 2) -> ReservationRequest:
    return ReservationRequest.model_validate(
        {
            "tenantId": "acme",
            "poolId": pool,
            "devices": [{"class": "gpu", "count": gpus}],
            "resources": {"cpu": 2},
            "duration": "1h",
            "idempotencyKey": key,
        }
    )


async def _written(engine: AsyncEngine, pool: str) -> dict[str, int]:
    """What placements wrote in the pool: allocations, bookings, scalar and quota holdings."""
    async with engine.connect() as conn:
        counts = {}
        for name, table in (
            ("allocations", allocations),
            ("bookings", device_bookings),
            ("scalars", scalar_holdings),
            ("quota", quota_holdings),
        ):
            counts[name] = (
                await conn.execute(
                    sa.select(sa.func.count()).select_from(table).where(table.c.pool_id == pool)
                )
            ).scalar_one()
        return counts


async def _inventory_changes(engine: AsyncEngine, pool: str, node_id: str, name: str) -> Node:
    """On another connection: add a node and relabel one, each forbidden to wait for a lock."""
    async with engine.begin() as other:
        await other.exec_driver_sql(NOT_BLOCKED)
        added = await inventory.add_node(other, pool, node_body(name, 4))
    async with engine.begin() as other:
        await other.exec_driver_sql(NOT_BLOCKED)
        await inventory.set_labels(other, node_id, {"rack": "r1"})
    return added


async def test_a_node_add_is_not_blocked_by_a_create_holding_its_plan(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, views = await make_pool_with_nodes(engine, [node_body("a0", 4), node_body("a1", 4)])
    seen: list[Candidate] = []
    added: list[Node] = []

    async def hold_plan(attempt: int, candidate: Candidate) -> None:
        seen.append(candidate)  # the create has written its row and planned; its commit waits for us
        added.append(await _inventory_changes(engine, pool, views[1].id, "late"))

    config = CapacityConfig(SchedulerOptions(top_n=1))
    view, created = await create_reservation(
        engine, PoolCache(), config, _body(pool, "held"), before_commit=hold_plan
    )
    assert created and view.status == "placed", view
    assert len(seen) == 1 and view.allocations[0].nodeId == seen[0].node_id
    assert added[0].name == "late"
    async with engine.connect() as conn:
        names = (await conn.execute(sa.select(nodes.c.name).where(nodes.c.pool_id == pool))).scalars()
        assert sorted(names) == ["a0", "a1", "late"]
    node = await inventory.get_node(engine, views[1].id)
    assert node.labels["rack"] == "r1"


async def test_an_archive_between_plan_and_commit_answers_as_an_archived_pool(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body("b0", 4)])
    config = CapacityConfig(SchedulerOptions())
    planned: list[int] = []

    async def archive(attempt: int, candidate: Candidate) -> None:
        planned.append(attempt)
        async with engine.begin() as other:
            await other.exec_driver_sql(NOT_BLOCKED)
            await inventory.archive_pool(other, pool)

    raced, created = await create_reservation(
        engine, PoolCache(), config, _body(pool, "raced"), before_commit=archive
    )
    assert created and planned == [1]  # it had planned: the archive came between plan and commit
    # the answer of a create on a pool archived before it, field for field (but its own id and key)
    before, _ = await create_reservation(engine, PoolCache(), config, _body(pool, "after"))
    volatile = {"id", "idempotencyKey", "createdAt", "spec"}
    assert raced.model_dump(exclude=volatile, exclude_unset=True) == before.model_dump(
        exclude=volatile, exclude_unset=True
    )
    assert raced.status == "pending" and raced.allocations == []
    assert [c.message for c in raced.conditions] == [ARCHIVED_POOL]
    assert await _written(engine, pool) == {"allocations": 0, "bookings": 0, "scalars": 0, "quota": 0}


def _request(pool: str, start: Any) -> PlacementRequest:
    return PlacementRequest(
        tenant_id="acme",
        pool_id=pool,
        devices=(DeviceRequest("gpu", 2),),
        resources={"cpu": Decimal(2)},
        start=start,
        end=day_after(start),
    )


async def _entries(engine: AsyncEngine, pool: str, n: int) -> list[BatchEntry]:
    start = await db_time(engine)
    async with engine.begin() as conn:
        ids = [await reservation_row(conn, pool) for _ in range(n)]
    return [BatchEntry(rid, _request(pool, start), {"gpu": Decimal(2), "cpu": Decimal(2)}) for rid in ids]


async def test_a_batch_holding_its_plans_blocks_no_inventory_change(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, views = await make_pool_with_nodes(engine, [node_body("c0", 4), node_body("c1", 4)])
    entries = await _entries(engine, pool, 3)

    async def hold_plans(attempt: int, candidates: list[Candidate]) -> None:
        if attempt == 1:
            await _inventory_changes(engine, pool, views[0].id, "late")

    async with engine.begin() as conn:
        await place_batch(
            conn, PoolCache(), BatchOptions(SchedulerOptions(), 3, before_commit=hold_plans), pool, entries
        )
    assert all(isinstance(e.outcome, Placed) for e in entries), [e.outcome for e in entries]


async def test_a_batch_whose_pool_is_archived_before_its_commit_writes_nothing(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body("d0", 8)])
    entries = await _entries(engine, pool, 3)

    async def archive(attempt: int, candidates: list[Candidate]) -> None:
        assert len(candidates) == 3  # all three planned
        async with engine.begin() as other:
            await other.exec_driver_sql(NOT_BLOCKED)
            await inventory.archive_pool(other, pool)

    async with engine.begin() as conn:
        await place_batch(
            conn, PoolCache(), BatchOptions(SchedulerOptions(), 3, before_commit=archive), pool, entries
        )
    assert [e.outcome for e in entries] == [Pending(ARCHIVED_POOL)] * 3
    assert (await _written(engine, pool))["bookings"] == 0


async def _add_nodes(engine: AsyncEngine, pool: str, n: int) -> list[str]:
    names = []
    for i in range(n):
        async with engine.begin() as conn:
            names.append((await inventory.add_node(conn, pool, node_body(f"n{i}", 2))).name)
        await asyncio.sleep(0)
    return names


async def test_creates_and_node_adds_race_without_double_booking(clean_db: AsyncEngine) -> None:
    """Creates and node adds on their own connections, at once: every add and every create answers,
    and no atom is booked twice over overlapping windows (the exclusion constraint would raise; the
    count of bookings equals the atoms the placed reservations name)."""
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body("r0", 4), node_body("r1", 4)])
    config = CapacityConfig(SchedulerOptions(top_n=3))
    cache = PoolCache()
    rng = random.Random(21)

    async def client(i: int) -> Reservation:
        await asyncio.sleep(rng.random() * 0.05)
        view, _ = await create_reservation(engine, cache, config, _body(pool, f"race-{i}", gpus=1))
        return view

    results = await asyncio.gather(*(client(i) for i in range(24)), _add_nodes(engine, pool, 6))
    views, added = results[:-1], results[-1]
    assert added == [f"n{i}" for i in range(6)]
    placed = [v for v in views if v.status == "placed"]
    # 8 + 12 GPUs, one each: at most 20 fit (fewer when a create planned before the nodes came)
    assert 8 <= len(placed) <= 20
    for v in views:
        assert v.status == "placed" or v.conditions[0].message.startswith("no node fits"), v
    atoms = [a for v in placed for alloc in v.allocations for a in alloc.atoms]
    assert len(atoms) == len(set(atoms)) == (await _written(engine, pool))["bookings"]
