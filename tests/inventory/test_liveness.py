"""Liveness: ``heartbeat lost`` after the grace period, safe with several replicas (real PostgreSQL,
real service processes)."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path

import asyncpg
import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.tables import nodes, pools
from app.inventory import service as inventory
from app.inventory.hello import hello
from app.inventory.liveness import sweep_heartbeats
from app.inventory.schemas import HelloBody
from tests.agent_host import h200_host
from tests.conftest import ADMIN_KEY
from tests.servers import running_server


async def _agents(engine: AsyncEngine, count: int, interval: int = 10) -> tuple[str, list[str]]:
    async with engine.begin() as conn:
        pool = (await inventory.create_pool(conn, "live")).id
    topo, xml = h200_host(1)
    ids = []
    for i in range(count):
        body = HelloBody(
            poolId=pool,
            name=f"n{i}",
            topo=topo,
            nvidiaSmiXml=xml.replace("GPU-00000000-", f"GPU-{i:08d}-"),
            intervalSeconds=interval,
        )
        ids.append((await hello(engine, body)).view.id)
    return pool, ids


async def _db_now(engine: AsyncEngine):  # noqa: ANN202
    async with engine.connect() as conn:
        return (await conn.exec_driver_sql("SELECT now()")).scalar_one()


async def test_sweep_marks_only_overdue_nodes_and_a_heartbeat_clears_it(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, ids = await _agents(engine, 2, interval=10)
    async with engine.begin() as conn:
        await inventory.set_cordon(conn, ids[1], True)
        version = (await conn.execute(sa.select(pools.c.inventory_version))).scalar_one()
    now = await _db_now(engine)
    async with engine.begin() as conn:
        assert await sweep_heartbeats(conn, now + timedelta(seconds=29)) == 0  # within 3 x 10 s
    async with engine.begin() as conn:
        assert await sweep_heartbeats(conn, now + timedelta(seconds=31)) == 2
    async with engine.begin() as conn:
        assert await sweep_heartbeats(conn, now + timedelta(seconds=3600)) == 0  # each node once
        rows = dict((await conn.execute(sa.select(nodes.c.id, nodes.c.no_schedule_reasons))).all())
        assert rows == {ids[0]: ["heartbeat lost"], ids[1]: ["cordoned", "heartbeat lost"]}
        assert (await conn.execute(sa.select(pools.c.inventory_version))).scalar_one() == version
    async with engine.begin() as conn:  # an explicit grace overrides 3 x the interval
        await conn.execute(sa.update(nodes).values(heartbeat_lost=False, no_schedule_reasons=[]))
        assert await sweep_heartbeats(conn, now + timedelta(seconds=6), grace_seconds=5) == 2


async def test_two_sweeps_at_once_claim_disjoint_nodes(clean_db: AsyncEngine) -> None:
    engine = clean_db
    _, ids = await _agents(engine, 7, interval=1)
    later = await _db_now(engine) + timedelta(seconds=60)
    first = await engine.connect()
    second = await engine.connect()
    try:
        await first.begin()
        await second.begin()
        a = await sweep_heartbeats(first, later, batch=4)  # holds 4 node rows, uncommitted
        b = await asyncio.wait_for(sweep_heartbeats(second, later, batch=10), 5)  # skips them, no wait
        assert (a, b) == (4, 3)
        await first.commit()
        await second.commit()
    finally:
        await first.close()
        await second.close()
    async with engine.connect() as conn:
        lost = (await conn.execute(sa.select(nodes.c.no_schedule_reasons))).scalars().all()
    assert lost == [["heartbeat lost"]] * 7


def _lost_total(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("bc_agent_heartbeats_lost_total "):
            return float(line.split()[1])
    return 0.0


async def _seconds_since_heartbeat(url: str, node_id: str) -> float:
    """now() - last_heartbeat_at of ``node_id``, in seconds, by the database's clock."""
    conn = await asyncpg.connect(url)
    try:
        return float(
            await conn.fetchval(
                "SELECT extract(epoch FROM now() - last_heartbeat_at) FROM nodes WHERE id = $1", node_id
            )
        )
    finally:
        await conn.close()


def test_two_service_processes_mark_a_silent_node_once(
    database_url: str, clean_db: AsyncEngine, tmp_path: Path
) -> None:
    env = {"BC_NODE_HEARTBEAT_GRACE": "2", "BC_NODE_LIVENESS_SWEEP_SECONDS": "0.3"}
    topo, xml = h200_host(1)
    with (
        running_server(database_url, tmp_path / "a", extra_env=env) as one,
        running_server(database_url, tmp_path / "b", extra_env=env) as two,
    ):
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        pool = httpx.post(one.url + "/v1/pools", json={"name": "live"}, headers=admin).json()["id"]
        body = {"poolId": pool, "name": "quiet", "topo": topo, "nvidiaSmiXml": xml, "intervalSeconds": 1}
        node = httpx.post(two.url + "/v1/nodes/hello", json=body, headers=admin, timeout=30).json()["nodeId"]
        started = time.monotonic()
        reasons: list[str] = []
        while time.monotonic() - started < 20:
            reasons = httpx.get(f"{one.url}/v1/nodes/{node}", headers=admin).json()["noScheduleReasons"]
            if reasons:
                break
            time.sleep(0.2)
        assert reasons == ["heartbeat lost"], one.output()
        # never before the grace: by the database's clock, at least 2 s passed since the last Hello (how
        # soon after it the sweep comes is not asserted: a loaded machine may take longer)
        assert asyncio.run(_seconds_since_heartbeat(database_url, node)) >= 2.0
        assert _lost_total(one.url) + _lost_total(two.url) == 1  # one replica claimed it
        beat = httpx.post(f"{one.url}/v1/nodes/{node}/heartbeat", json={"devices": []}, headers=admin).json()
        assert beat == {"nodeId": node, "changed": True, "noScheduleReasons": []}
