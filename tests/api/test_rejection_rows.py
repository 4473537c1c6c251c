"""Why not, exactly (issue 25, Done when 1 and 3; docs/reasons.md, "Rejection rows" and "Nearest
misses"), through HTTP on the real app: on a pool of 100 nodes in mixed states a preview that does not
fit answers rejection rows whose counts add up to 100, each row's reason matching the state of the nodes
it names, and nearest misses; a pending reservation's Unschedulable condition carries the same."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.tables import reservations
from tests.capacity.helpers import book, db_time
from tests.factories import add_node, gpu_node, make_pool, reservation

RACK_R1 = [{"class": "gpu", "count": 8, "selector": "rack=r1"}]  # a node label, as selectors see them
DEDICATED = {"key": "dedicated", "value": "beta", "effect": "NoSchedule"}
MAINTENANCE = {"key": "gpu", "value": "maintenance", "effect": "NoSchedule"}
# name prefix -> (how many, the reason its nodes must be rejected with, the filter)
STATES: dict[str, tuple[int, str, str]] = {
    "cordoned": (10, "cordoned", "schedulable"),
    "maint": (10, "tainted gpu=maintenance", "schedulable"),
    "dedicated": (10, "tainted dedicated=beta", "schedulable"),
    "rack2": (10, "selector: 0 of 8 gpu match", "selector"),
    "smallcpu": (10, "scalars: cpu needs 32, 16 free", "scalars"),
    "sick": (10, "fits: 6 of 8 gpu free", "fits"),
    "busy3": (20, "fits: 5 of 8 gpu free", "fits"),
    "busy1": (20, "fits: 7 of 8 gpu free", "fits"),
}


async def _mixed_pool(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> tuple[str, dict[str, dict[str, Any]]]:
    pool = await make_pool(client)
    views: dict[str, dict[str, Any]] = {}
    for prefix, (count, _, _) in STATES.items():
        for i in range(count):
            name = f"{prefix}-{i:02d}"
            body = gpu_node(
                name,
                8,
                labels={"rack": "r2" if prefix == "rack2" else "r1"},
                cpu=16 if prefix == "smallcpu" else 64,
                cordoned=prefix == "cordoned",
                taints=[DEDICATED] if prefix == "dedicated" else [MAINTENANCE] if prefix == "maint" else None,
            )
            views[name] = await add_node(client, pool, body)
    now = await db_time(engine)
    async with engine.begin() as conn:
        for name, view in views.items():
            held = 3 if name.startswith("busy3") else 1 if name.startswith("busy1") else 0
            if held:
                atoms = [f"{name}-GPU{i}" for i in range(held)]
                await book(conn, pool, view["id"], atoms, now - timedelta(hours=1), now + timedelta(days=3))
        # the bare rows book() writes hold their bookings as placed work (no wake plans them)
        await conn.execute(
            sa.update(reservations).where(reservations.c.pool_id == pool).values(status="placed")
        )
    for name, view in views.items():
        if name.startswith("sick"):
            sick = {
                "devices": [
                    {"id": f"{name}-GPU0", "healthy": False},
                    {"id": f"{name}-GPU1", "healthy": False},
                ]
            }
            r = await client.post(f"/v1/nodes/{view['id']}/health", json=sick)
            assert r.status_code == 200, r.text
    return pool, views


def _check_rows(rows: list[dict[str, Any]]) -> None:
    assert sum(r["count"] for r in rows) == 100
    by_reason = {r["reason"]: r for r in rows}
    assert len(by_reason) == len(rows) == len(STATES)  # one row per distinct reason
    for prefix, (count, reason, flt) in STATES.items():
        row = by_reason[reason]
        assert (row["filter"], row["count"]) == (flt, count), row
        assert len(row["nodes"]) == 5 and all(n.startswith(f"{prefix}-") for n in row["nodes"]), row
    assert [r["count"] for r in rows] == sorted((r["count"] for r in rows), reverse=True)


async def test_a_preview_that_fits_nowhere_answers_rows_adding_up_and_the_nearest_misses(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool, _ = await _mixed_pool(admin_client, engine)
    body = reservation(pool, 8, resources={"cpu": 32}, devices=RACK_R1)
    answer = (await admin_client.post("/v1/capacity/preview", json=body)).json()
    assert "fits" in answer, answer
    assert answer["fits"] is False and answer["reason"].startswith("no node fits (100 nodes): 20 × fits: 5")
    _check_rows(answer["rejections"])
    # closest: no atom missing and cpu to spare: the cordoned and tainted nodes (all 8 GPUs free, rack r1),
    # by name; the small-cpu nodes miss no atom but half the cpu; the wrong rack misses all 8
    misses = answer["nearestMisses"]
    assert [(m["nodeName"], m["filter"], m["shortfall"], m["missingAtoms"]) for m in misses] == [
        ("cordoned-00", "schedulable", "cordoned", 0),
        ("cordoned-01", "schedulable", "cordoned", 0),
        ("cordoned-02", "schedulable", "cordoned", 0),
    ]

    # a preview that fits answers neither
    fits = (await admin_client.post("/v1/capacity/preview", json=reservation(pool, 8))).json()
    assert fits["fits"] is True and "rejections" not in fits and "nearestMisses" not in fits


async def test_a_pending_reservation_carries_the_same_rows_and_misses(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool, _ = await _mixed_pool(admin_client, engine)
    body = reservation(pool, 8, resources={"cpu": 32}, devices=RACK_R1)
    preview = (await admin_client.post("/v1/capacity/preview", json=body)).json()
    created = (await admin_client.post("/v1/reservations", json=body)).json()
    assert created["status"] == "pending"
    fetched = (await admin_client.get(f"/v1/reservations/{created['id']}")).json()
    [condition] = [c for c in fetched["conditions"] if c["type"] == "Unschedulable"]
    assert condition["message"] == preview["reason"]  # the seed's summary line stays the message
    assert condition["rejections"] == preview["rejections"]
    assert condition["nearestMisses"] == preview["nearestMisses"]
    _check_rows(condition["rejections"])
