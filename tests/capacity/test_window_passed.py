"""A pending reservation whose explicit start passes becomes ``ended`` (``WindowPassed``; issue 12, Done
when 3), and the wake edges are sent only for nodes that are schedulable for someone (mayBeSchedulableSql),
naming the dedicated tenant when there is one."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.controllers.lifecycle import end_passed_windows
from app.capacity.edges import WAKE_CHANNEL
from tests.factories import add_node, gpu_node, make_pool, reservation


async def test_a_pending_reservation_whose_start_passed_ends(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)  # no nodes: everything stays pending
    async with engine.connect() as conn:
        db_now = (await conn.exec_driver_sql("SELECT now()")).scalar_one()
    start = db_now + timedelta(minutes=5)
    fixed = (
        await admin_client.post("/v1/reservations", json=reservation(pool, 1, start=start.isoformat()))
    ).json()
    floating = (await admin_client.post("/v1/reservations", json=reservation(pool, 1))).json()
    assert fixed["status"] == floating["status"] == "pending"

    assert await end_passed_windows(engine, now=start - timedelta(seconds=1)) == []  # not yet
    assert await end_passed_windows(engine, now=start) == [fixed["id"]]
    assert await end_passed_windows(engine, now=start + timedelta(hours=1)) == []  # once only

    ended = (await admin_client.get(f"/v1/reservations/{fixed['id']}")).json()
    assert ended["status"] == "ended" and ended["allocations"] == []
    assert ended["conditions"][-1] == {
        "type": "Ended",
        "status": "True",
        "reason": "WindowPassed",
        "message": f"the start {start.isoformat()} passed while the reservation was pending",
    }
    # a reservation without an explicit start never passes its window: it waits
    assert (await admin_client.get(f"/v1/reservations/{floating['id']}")).json()["status"] == "pending"


async def _heard(engine: AsyncEngine, act: Any) -> list[dict[str, Any]]:
    """The wake payloads sent while ``act()`` ran (LISTEN on a connection of our own)."""
    heard: list[dict[str, Any]] = []
    async with engine.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        assert raw is not None

        def listener(*args: Any) -> None:
            heard.append(json.loads(args[3]))

        await raw.add_listener(WAKE_CHANNEL, listener)
        await act()
        await asyncio.sleep(0.2)
        await raw.remove_listener(WAKE_CHANNEL, listener)
    return heard


async def test_node_edges_name_the_dedicated_tenant_and_skip_unschedulable_nodes(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    dedicated = {"key": "dedicated", "value": "acme", "effect": "NoSchedule"}
    node = (await add_node(admin_client, pool, gpu_node("edge", 1, cordoned=True, taints=[dedicated])))["id"]

    async def cordon() -> None:
        assert (await admin_client.post(f"/v1/nodes/{node}/cordon")).status_code == 200

    async def uncordon() -> None:
        assert (await admin_client.post(f"/v1/nodes/{node}/uncordon")).status_code == 200

    async def untaint() -> None:
        assert (await admin_client.put(f"/v1/nodes/{node}/taints", json={"taints": []})).status_code == 200

    assert await _heard(engine, cordon) == []  # still cordoned: no edge
    assert await _heard(engine, uncordon) == [{"pool": pool, "tenant": "acme"}]  # only acme can use it
    assert await _heard(engine, untaint) == [{"pool": pool, "tenant": None}]  # everyone
