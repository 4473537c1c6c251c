"""The lifecycle controller with two service processes (issue 11): both sweep the same reservations with
``FOR UPDATE SKIP LOCKED``, and each reservation is ended exactly once, soon after its end."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.factories import add_node, gpu_node, make_pool, reservation
from tests.servers import Server, admin_clients, running_servers

RESERVATIONS = 32
TENANTS = 8  # quota rows serialize one tenant's creates: spread them, the subject here is the sweep
INTERVAL = 0.2  # BC_LIFECYCLE_INTERVAL of both processes: they sweep often, so they race on every row


@pytest.fixture
def servers(database_url: str, clean_db: AsyncEngine, tmp_path: Path) -> Iterator[list[Server]]:
    """Two service processes that sweep every 0.2 s."""
    with running_servers(database_url, tmp_path, 2, {"BC_LIFECYCLE_INTERVAL": str(INTERVAL)}) as started:
        yield started


@pytest.fixture
async def clients(servers: list[Server]) -> AsyncIterator[list[httpx.AsyncClient]]:
    """Admin clients of the two processes."""
    async with admin_clients(servers) as made:
        yield made


async def test_two_processes_end_each_reservation_once(
    servers: list[Server], clients: list[httpx.AsyncClient], engine: AsyncEngine
) -> None:
    pool = await make_pool(clients[0])
    await add_node(clients[0], pool, gpu_node("life", 8, cpu=RESERVATIONS, memory=None))

    async def reserve(i: int) -> str:
        # 1 to 3 seconds, one cpu each, through both processes
        body = reservation(pool, 0, resources={"cpu": 1}, duration=1 + i % 3, tenant=f"t{i % TENANTS}")
        r = await clients[i % 2].post("/v1/reservations", json=body)
        logs = "\n".join(s.output() for s in servers) if r.status_code >= 500 else ""
        assert r.status_code == 201 and r.json()["status"] == "placed", r.text + logs
        return r.json()["id"]

    ids = await asyncio.gather(*(reserve(i) for i in range(RESERVATIONS)))
    deadline = time.monotonic() + 20
    async with engine.connect() as conn:
        while time.monotonic() < deadline:
            left = (
                await conn.exec_driver_sql("SELECT count(*) FROM reservations WHERE status = 'placed'")
            ).scalar_one()
            await conn.rollback()
            if left == 0:
                break
            await asyncio.sleep(0.2)
        rows = (
            await conn.exec_driver_sql(
                """SELECT id, status, ends_at, updated_at,
                          jsonb_array_length(
                            jsonb_path_query_array(conditions, '$[*] ? (@.type == "Ended")')
                          ),
                          conditions
                     FROM reservations"""
            )
        ).all()
    assert sorted(r.id for r in rows) == sorted(ids)
    for r in rows:
        assert r.status == "ended", r
        assert r[4] == 1, f"{r.id} was ended {r[4]} times: {r.conditions}"
        [ended] = [c for c in r.conditions if c["type"] == "Ended"]
        assert ended["reason"] == "WindowEnded" and ended["status"] == "True"
        # within the interval (plus a loaded machine's slack) of its end, never before it
        assert timedelta(0) <= r.updated_at - r.ends_at < timedelta(seconds=10), r
    # the views agree: ended, allocations kept as history
    view = (await clients[1].get(f"/v1/reservations/{ids[0]}")).json()
    assert view["status"] == "ended" and len(view["allocations"]) == 1
    assert view["allocations"][0]["releasedAt"] is None
