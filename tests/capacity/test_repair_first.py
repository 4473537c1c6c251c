"""Repair first (issue 21; docs/lifecycle.md, "Repair first"): BookingRepair runs on its own task and
never waits behind the wake of pending reservations. A wake of 600 pending reservations is held mid-way
by a real row lock; an atom marked unhealthy meanwhile is repaired, and the repair committed, while that
wake is still held. The wake loop does not claim a pending reservation while a repair is asked for. And
two service processes that both hear the repair edges repair each reservation exactly once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.capacity.repair_first import RepairController
from app.capacity.snapshot import PoolCache
from app.capacity.wake import wake_pool
from app.main import capacity_config
from tests.capacity.helpers import overlapping_bookings
from tests.conftest import settings_for
from tests.factories import add_node, gpu_node, make_pool, reservation
from tests.servers import Server, admin_clients, running_servers

BACKLOG = 600
GIVE_UP = 60.0  # seconds: a bound on waiting for an outcome, never a measured figure


async def _pending_backlog(client: httpx.AsyncClient, pool: str, count: int) -> None:
    """``count`` 1-GPU reservations of ``pool`` through the bulk route; the pool's node is cordoned, so
    each is answered 201 pending."""
    for first in range(0, count, 200):
        items = [reservation(pool, 1, key=f"backlog-{i}") for i in range(first, min(first + 200, count))]
        answer = await client.post("/v1/reservations/batch", json={"items": items})
        assert answer.status_code == 200, answer.text
        assert {item["reservation"]["status"] for item in answer.json()["items"]} == {"pending"}


async def _count(engine: AsyncEngine, sql: str, **params: Any) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(sa.text(sql), params)).scalar_one())


async def _wait_until(check: Any, what: str) -> None:
    deadline = time.monotonic() + GIVE_UP
    while not await check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.02)


async def _blocked_by(engine: AsyncEngine, holder: AsyncConnection) -> int:
    """How many backends wait for a lock ``holder``'s backend holds."""
    pid = (await holder.execute(sa.text("SELECT pg_backend_pid()"))).scalar_one()
    return await _count(
        engine, "SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))", pid=pid
    )


async def test_a_repair_commits_while_a_wake_of_600_pending_is_held(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    busy = await make_pool(admin_client)  # the pool with the backlog
    backlog_node = await add_node(admin_client, busy, gpu_node("backlog", 8))
    assert (await admin_client.post(f"/v1/nodes/{backlog_node['id']}/cordon")).status_code == 200
    await _pending_backlog(admin_client, busy, BACKLOG)

    other = await make_pool(admin_client)  # the pool where an atom breaks
    node = await add_node(admin_client, other, gpu_node("breaks", 4))
    placed = (await admin_client.post("/v1/reservations", json=reservation(other, 2))).json()
    assert placed["status"] == "placed"
    broken = placed["allocations"][0]["atoms"][0]

    async with engine.connect() as holder:
        # hold the backlog node's atoms: the wake's guarded commit (atoms FOR SHARE) waits on them
        await holder.execute(
            sa.text("SELECT id FROM devices WHERE node_id = :n FOR UPDATE"), {"n": backlog_node["id"]}
        )
        uncordon = await admin_client.post(f"/v1/nodes/{backlog_node['id']}/uncordon")
        assert uncordon.status_code == 200  # a wake edge: the wake of the 600 starts, and is held
        await _wait_until(lambda: _blocked_by(engine, holder), "the wake to wait on the held atoms")

        mark = {"devices": [{"id": broken, "healthy": False}]}
        assert (await admin_client.post(f"/v1/nodes/{node['id']}/health", json=mark)).status_code == 200

        async def repaired() -> bool:
            view = (await admin_client.get(f"/v1/reservations/{placed['id']}")).json()
            return any(c["type"] == "Repaired" for c in view["conditions"])

        await _wait_until(repaired, "the repair")
        live_on_broken = "SELECT count(*) FROM device_bookings WHERE device_id = :a AND upper(during) > now()"
        assert await _count(engine, live_on_broken, a=broken) == 0
        # ... and the wake of the backlog is still where it was held: nothing of the 600 placed yet
        assert await _blocked_by(engine, holder) >= 1
        pending = "SELECT count(*) FROM reservations WHERE pool_id = :p AND status = :s"
        assert await _count(engine, pending, p=busy, s="pending") == BACKLOG
        await holder.rollback()

    async def backlog_woken() -> bool:  # let go, the wake goes on: the node's 8 GPUs are taken
        return await _count(engine, pending, p=busy, s="placed") == 8

    await _wait_until(backlog_woken, "the held wake to go on")


async def test_the_wake_loop_claims_nothing_while_a_repair_is_asked_for(
    admin_client: httpx.AsyncClient, engine: AsyncEngine, database_url: str
) -> None:
    """A controller not driven by the app's lifecycle: an edge heard makes it busy; a wake of a pool
    whose pending reservation fits claims nothing until the repair run is over, then places it."""
    pool = await make_pool(admin_client)
    backlog_node = await add_node(admin_client, pool, gpu_node("gate", 2))
    assert (await admin_client.post(f"/v1/nodes/{backlog_node['id']}/cordon")).status_code == 200
    await _pending_backlog(admin_client, pool, 1)
    # schedulable again without an edge (the app's own wake must not take it): the test's wake does
    async with engine.begin() as conn:
        await conn.execute(
            sa.text("UPDATE nodes SET cordoned = false, no_schedule_reasons = '{}' WHERE id = :n"),
            {"n": backlog_node["id"]},
        )

    repair = RepairController(PoolCache(), capacity_config(settings_for(database_url)), 3600)
    repair.heard(pool)
    assert repair.busy
    wake = asyncio.create_task(
        wake_pool(engine, PoolCache(), repair.config, pool, yield_to=repair.wait_for_repairs)
    )
    for _ in range(50):  # the wake gets every chance to run: it waits for the repair
        await asyncio.sleep(0.01)
    assert not wake.done()
    placed = "SELECT count(*) FROM reservations WHERE pool_id = :p AND status = 'placed'"
    assert await _count(engine, placed, p=pool) == 0

    run = asyncio.create_task(repair.run(engine))  # nothing broken: it repairs nothing
    await asyncio.sleep(0)  # the run has started
    repair.heard(pool)  # an edge heard during the run asks for another run: still busy after this one
    assert await run == []
    assert repair.busy and not wake.done()

    await repair.run(engine)  # nothing heard during this run: the wake goes on
    assert not repair.busy
    [woken] = await asyncio.wait_for(wake, GIVE_UP)
    assert woken.result == "placed"
    assert await _count(engine, placed, p=pool) == 1


@pytest.fixture
def servers(database_url: str, clean_db: AsyncEngine, tmp_path: Path) -> Iterator[list[Server]]:
    """Two service processes: both hear every repair edge and run BookingRepair on it."""
    with running_servers(database_url, tmp_path, 2) as started:
        yield started


async def test_two_replicas_repair_each_reservation_once(servers: list[Server], engine: AsyncEngine) -> None:
    async with admin_clients(servers) as (a, b):
        pool = await make_pool(a)
        for i in range(2):
            await add_node(a, pool, gpu_node(f"twin-{i}", 8))
        placed = [(await a.post("/v1/reservations", json=reservation(pool, 1))).json() for _ in range(8)]
        assert {p["status"] for p in placed} == {"placed"}
        booked = [
            (alloc["nodeId"], atom) for p in placed for alloc in p["allocations"] for atom in alloc["atoms"]
        ]
        # every booked atom turns unhealthy at once, one request each, through both processes in turn:
        # both processes hear every repair edge and race for the same reservations
        marks = [
            (a, b)[i % 2].post(f"/v1/nodes/{node}/health", json={"devices": [{"id": atom, "healthy": False}]})
            for i, (node, atom) in enumerate(booked)
        ]
        assert {r.status_code for r in await asyncio.gather(*marks)} == {200}
        broken = [atom for _, atom in booked]
        live_on_broken = (
            "SELECT count(*) FROM device_bookings WHERE device_id = ANY(:a) AND upper(during) > now()"
        )

        async def settled() -> bool:
            return await _count(engine, live_on_broken, a=broken) == 0

        await _wait_until(settled, "the repairs")
        await asyncio.sleep(0.5)  # a second repair of one reservation would land by now
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    sa.text(
                        """SELECT r.status, count(a.id) FILTER (WHERE a.released_at IS NULL) AS live,
                                  count(a.id) AS allocations,
                                  jsonb_array_length(jsonb_path_query_array(
                                    r.conditions, '$[*] ? (@.type == "Repaired")')) AS repaired
                             FROM reservations r JOIN allocations a ON a.reservation_id = r.id
                            WHERE r.id = ANY(:ids) GROUP BY r.id"""
                    ),
                    {"ids": [p["id"] for p in placed]},
                )
            ).all()
            assert await overlapping_bookings(conn) == 0
        # 8 healthy GPUs are left for 8 reservations: each moved once, none twice, none lost
        assert [tuple(r) for r in rows] == [("placed", 1, 2, 1)] * 8
