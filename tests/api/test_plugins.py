"""Scheduler plugins loaded from settings by import path are used on preview and reserve (issue 3)."""

from __future__ import annotations

from typing import Any

import httpx

from app.main import create_app
from tests.conftest import settings_for
from tests.factories import add_node, gpu_node, make_pool, reservation


async def test_plugin_from_settings_filters_and_scores_on_every_path(
    database_url: str, clean_db: Any
) -> None:
    settings = settings_for(
        database_url,
        scheduler_plugins=["tests.example_plugins:rack_affinity"],
        scheduler_weights={"binpack": 0.0},
    )
    app = create_app(settings, run_migrations=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        from tests.conftest import ADMIN_KEY

        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        ) as client:
            pool = await make_pool(client)
            await add_node(client, pool, gpu_node("q", labels={"rack": "r13"}))
            b = await add_node(client, pool, gpu_node("b", labels={"rack": "b2"}))
            a = await add_node(client, pool, gpu_node("z", labels={"rack": "a1"}))
            pv = (await client.post("/v1/capacity/preview", json=reservation(pool, 1))).json()
            assert [c["nodeId"] for c in pv["candidates"]] == [a["id"], b["id"]]
            assert pv["candidates"][0]["scores"]["rack-a"] == 1.0
            assert pv["candidates"][1]["scores"]["rack-a"] == 0.0
            first = (await client.post("/v1/reservations", json=reservation(pool, 8))).json()
            second = (await client.post("/v1/reservations", json=reservation(pool, 8))).json()
            placed_on = {first["allocations"][0]["nodeId"], second["allocations"][0]["nodeId"]}
            assert placed_on == {a["id"], b["id"]}  # the quarantined rack takes nothing
            big = (await client.post("/v1/reservations", json=reservation(pool, 8))).json()
            assert big["status"] == "pending"
            assert big["conditions"][0]["message"] == (
                "no node fits (3 nodes): 2 × fits: 0 of 8 gpu free; "
                "1 × rack-affinity/no-quarantine-rack: rack r13 is quarantined"
            )
