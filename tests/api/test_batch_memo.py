"""A bulk batch decides each item exactly as the item sent alone would (issue 21): the per-node memo a
batch keeps across its items is keyed by what the filters and scorers declare they read
(docs/extending.md, "What a filter reads"), so an item that differs from an earlier one only in a field
the memo once left out (``topology``) is planned afresh, on real PostgreSQL through the real app."""

from __future__ import annotations

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.factories import add_node, gpu_node, make_pool, reservation

NVLINK = [{"class": "gpu", "count": 2, "topology": "nvlink-all"}]


async def test_a_batch_keeps_nvlink_all_off_sys_linked_gpus(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    for name in ("sys-a", "sys-b"):
        await add_node(admin_client, pool, gpu_node(name, 4, link="SYS"))
    alone = await admin_client.post("/v1/reservations", json=reservation(pool, key="alone", devices=NVLINK))
    assert alone.status_code == 201, alone.text
    assert alone.json()["status"] == "pending", alone.json()
    items = [
        reservation(pool, 2, key="plain"),
        reservation(pool, key="nvlink", devices=NVLINK),
        reservation(pool, 2, key="plain-2"),
        reservation(pool, key="nvlink-2", devices=NVLINK),
    ]
    r = await admin_client.post("/v1/reservations/batch", json={"items": items})
    assert r.status_code == 200, r.text
    views = [a["reservation"] for a in r.json()["items"]]
    assert [v["status"] for v in views] == ["placed", "pending", "placed", "pending"], views
    for view in (views[1], views[3]):
        assert view["allocations"] == [], view
        assert "topology: no NVLink-complete set of 2 gpu" in view["conditions"][0]["message"], view
    async with clean_db.connect() as conn:
        booked = (
            await conn.execute(
                sa.text(
                    "SELECT count(*) FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id"
                    " JOIN reservations r ON r.id = a.reservation_id WHERE r.idempotency_key LIKE 'nvlink%'"
                )
            )
        ).scalar_one()
    assert booked == 0
