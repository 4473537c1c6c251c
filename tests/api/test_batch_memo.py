"""A bulk batch decides each item exactly as the item sent alone would (issue 21): the per-node memo a
batch keeps across its items is keyed by what the filters and scorers declare they read
(docs/extending.md, "What a filter reads"), so an item that differs from an earlier one only in a field
the memo once left out (``topology``) is planned afresh, on real PostgreSQL through the real app; and a
mixed batch decides item by item as the same items sent one at a time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import ADMIN_KEY, settings_for
from tests.factories import add_node, gpu_node, make_pool, reservation

NVLINK = [{"class": "gpu", "count": 2, "topology": "nvlink-all"}]


async def test_a_batch_keeps_nvlink_all_off_sys_linked_gpus(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    for name in ("sys-a", "sys-b"):
        await add_node(admin_client, pool, gpu_node(name, 4, link="SYS"))
    # cordoned: it places nothing, but makes nvlink-all of 2 a request the pool could hold (checked at
    # intake, docs/api.md), so it is planned and stays pending rather than refused
    await add_node(admin_client, pool, gpu_node("nv-cordoned", 4, cordoned=True))
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


@pytest.fixture
async def top1_client(database_url: str, clean_db: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    """An admin client of the real app with topN 1 (the best node is chosen, so decisions compare)."""
    from app.main import create_app

    application = create_app(settings_for(database_url, scheduler_top_n=1), run_migrations=False)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers) as c:
            yield c


async def _pool_of(client: httpx.AsyncClient, prefix: str) -> str:
    pool = await make_pool(client)
    await add_node(client, pool, gpu_node(f"{prefix}-sys", 4, link="SYS", cpu=8))
    await add_node(client, pool, gpu_node(f"{prefix}-nv", 4, link="NV12", cpu=8))
    await add_node(client, pool, gpu_node(f"{prefix}-h", 4, link="SYS", attributes={"gpuProduct": "H100"}))
    await add_node(client, pool, gpu_node(f"{prefix}-t1", 8, taints=[{"key": "dedicated", "value": "t1"}]))
    return pool


def _decision(view: dict[str, Any], prefix: str) -> tuple[Any, ...]:
    # a node's GPUs are <node name>-GPU<i> (tests.factories.gpu_node)
    nodes = tuple(
        sorted(a["atoms"][0].rsplit("-GPU", 1)[0].removeprefix(prefix) for a in view["allocations"])
    )
    message = view["conditions"][0]["message"] if view["status"] == "pending" else None
    return view["status"], nodes, sum(len(a["atoms"]) for a in view["allocations"]), message


async def test_a_batch_decides_as_its_items_sent_one_at_a_time(top1_client: httpx.AsyncClient) -> None:
    """The same items, one create at a time on one pool and as one bulk batch on a twin pool: the same
    status, nodes, atom counts and pending reasons, item by item (plain and nvlink-all, a selector,
    tenants against a dedication, cpu; the SYS node is the first the plain items fill)."""
    h100 = "gpuProduct == H100"  # shorthand values are bare words: quotes would be part of the value
    shapes: list[dict[str, Any]] = [
        {"devices": [{"class": "gpu", "count": 2}]},
        {"devices": NVLINK},
        {"devices": [{"class": "gpu", "count": 2}], "tenantId": "t1"},
        {"devices": NVLINK, "tenantId": "t1"},
        {"devices": [{"class": "gpu", "count": 1, "selector": h100}]},
        {"devices": [{"class": "gpu", "count": 1, "selector": h100, "topology": "nvlink-all"}]},
        {"devices": [{"class": "gpu", "count": 2}], "resources": {"cpu": 6}},
        {"devices": NVLINK, "resources": {"cpu": 6}},
        {"devices": NVLINK},
        {"devices": [{"class": "gpu", "count": 2}]},
        {"devices": NVLINK, "tenantId": "t1"},
    ]
    single, batched = await _pool_of(top1_client, "s"), await _pool_of(top1_client, "b")
    one_by_one = []
    for i, shape in enumerate(shapes):
        r = await top1_client.post("/v1/reservations", json={**reservation(single, key=f"s{i}"), **shape})
        assert r.status_code == 201, r.text
        one_by_one.append(_decision(r.json(), "s-"))
    items = [{**reservation(batched, key=f"b{i}"), **shape} for i, shape in enumerate(shapes)]
    r = await top1_client.post("/v1/reservations/batch", json={"items": items})
    assert r.status_code == 200, r.text
    as_batch = [_decision(a["reservation"], "b-") for a in r.json()["items"]]
    assert as_batch == one_by_one
    assert {d[0] for d in one_by_one} == {"placed", "pending"}  # both kinds of decision are compared
