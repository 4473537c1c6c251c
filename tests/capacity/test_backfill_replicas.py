"""Planned starts with two service processes (issue 24, Done when 3; docs/lifecycle.md, "Planned
starts"): many pending reservations get planned windows while edges (ends, releases, creates) reach both
processes, whose wakes, planner passes and planned-start sweeps all run at once. The books' SQL sweep
(tests/capacity/invariants.py) finds no double booking at any instant and no reservation placed twice."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.capacity.helpers import overlapping_bookings
from tests.capacity.invariants import violations
from tests.factories import add_node, gpu_node, make_pool, reservation
from tests.servers import Server, admin_clients, running_servers

NODES = 3
BIG = 9  # 8-GPU requests: each waits behind the 4-GPU holdings, so each is planned
SMALL = 24  # 4-GPU requests of 1 or 2 s: they backfill before the planned windows, or wait
GIVE_UP = 60.0  # seconds: a bound on the run, never a measured figure


@pytest.fixture
def servers(database_url: str, clean_db: AsyncEngine, tmp_path: Path) -> Iterator[list[Server]]:
    """Two service processes that sweep, end and start planned windows every 0.2 s."""
    env = {"BC_LIFECYCLE_INTERVAL": "0.2", "BC_LIFECYCLE_SWEEP": "0.3"}
    with running_servers(database_url, tmp_path, 2, env) as started:
        yield started


@pytest.fixture
async def clients(servers: list[Server]) -> AsyncIterator[list[httpx.AsyncClient]]:
    async with admin_clients(servers) as made:
        yield made


async def test_two_processes_plan_and_place_each_once_without_double_booking(
    servers: list[Server], clients: list[httpx.AsyncClient], engine: AsyncEngine
) -> None:
    pool = await make_pool(clients[0])
    for i in range(NODES):
        await add_node(clients[i % 2], pool, gpu_node(f"bf{i}", 8, cpu=64, memory=None))

    async def reserve(i: int, gpus: int, seconds: int, tenant: str) -> dict[str, Any]:
        body = reservation(pool, gpus, duration=seconds, tenant=tenant)
        r = await clients[i % 2].post("/v1/reservations", json=body)
        logs = "\n".join(s.output() for s in servers) if r.status_code >= 500 else ""
        assert r.status_code == 201, r.text + logs
        return r.json()

    for i in range(NODES):  # 4 GPUs of each node held for 2 s
        assert (await reserve(i, 4, 2, "holder"))["status"] == "placed"
    big = await asyncio.gather(*(reserve(i, 8, 2, f"t{i % 4}") for i in range(BIG)))
    small = await asyncio.gather(*(reserve(i, 4, 1 + i % 2, f"s{i % 4}") for i in range(SMALL)))
    views = [*big, *small]

    # releases through both processes while the others are planned, woken and started
    for i, view in enumerate(small[:6]):
        r = await clients[(i + 1) % 2].post(f"/v1/reservations/{view['id']}/release")
        assert r.status_code == 200, r.text

    planned_seen = 0
    given_up = time.monotonic() + GIVE_UP
    async with engine.connect() as conn:
        while True:
            assert await overlapping_bookings(conn) == 0  # at every look: no atom booked twice at once
            planned_seen = max(
                planned_seen,
                (
                    await conn.exec_driver_sql(
                        "SELECT count(*) FROM reservations WHERE planned_start IS NOT NULL"
                    )
                ).scalar_one(),
            )
            waiting = (
                await conn.exec_driver_sql(
                    "SELECT count(*) FROM reservations WHERE status IN ('pending', 'placed')"
                )
            ).scalar_one()
            await conn.rollback()
            if waiting == 0:
                break
            assert time.monotonic() < given_up, f"{waiting} reservations still pending or placed"
            await asyncio.sleep(0.1)
        rows = (
            await conn.exec_driver_sql(
                """SELECT id, status, planned_start,
                          jsonb_array_length(
                            jsonb_path_query_array(conditions, '$[*] ? (@.type == "Scheduled")')
                          ) AS scheduled,
                          (SELECT count(*) FROM allocations a WHERE a.reservation_id = r.id) AS allocations
                     FROM reservations r"""
            )
        ).all()
    assert planned_seen > 0  # the run did plan windows
    by_id = {r.id: r for r in rows}
    for view in views:
        row = by_id[view["id"]]
        assert row.planned_start is None, row
        assert row.scheduled <= 1 and row.allocations <= 1, row  # placed once at most
        if row.status == "ended":
            assert row.allocations == 1, row
    assert {by_id[v["id"]].status for v in big} == {"ended"}  # every large request ran
    assert await violations(engine) == {}
