"""The node list's items and the node view say what is allocated and free now (docs/api.md, "Inventory"):
atoms by class (total, allocated, free, unhealthy) and scalars (capacity, allocated, free), with the
node's ready, heartbeatLost and lastHeartbeat; after a reservation, and after its release. A reservation
for later holds nothing now."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import httpx

from tests.api.test_occupancy import occupancy, reserve
from tests.factories import add_node, gpu_node, make_pool, reservation


async def usage(client: httpx.AsyncClient, pool: str, node: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the node's list item, its view)."""
    listed = await client.get(f"/v1/pools/{pool}/nodes")
    assert listed.status_code == 200, listed.text
    [item] = [n for n in listed.json()["items"] if n["id"] == node]
    view = await client.get(f"/v1/nodes/{node}")
    assert view.status_code == 200, view.text
    return item, view.json()


async def test_allocated_and_free_now_after_a_reservation_and_its_release(
    admin_client: httpx.AsyncClient,
) -> None:
    pool = await make_pool(admin_client, "usage")
    body = gpu_node("u1", 4, memory=None)
    body["resources"]["cpu"] = {"allocatable": 10, "ratio": 1.5}  # capacity floor(15)
    node = (await add_node(admin_client, pool, body))["id"]
    other = (await add_node(admin_client, pool, gpu_node("u2", 2, cpu=None, memory=None)))["id"]
    r = await admin_client.post(
        f"/v1/nodes/{node}/health", json={"devices": [{"id": "u1-GPU3", "healthy": False}]}
    )
    assert r.status_code == 200, r.text

    item, view = await usage(admin_client, pool, node)
    idle = [{"class": "gpu", "total": 4, "allocated": 0, "free": 3, "unhealthy": 1}]
    assert item["deviceClasses"] == view["deviceClasses"] == idle
    assert (
        item["scalars"]
        == view["scalars"]
        == [{"resource": "cpu", "capacity": 15, "allocated": 0, "free": 15}]
    )
    assert (item["ready"], item["heartbeatLost"], item["lastHeartbeat"], item["devices"]) == (
        True,
        False,
        None,
        {"gpu": 4},
    )

    now = datetime.fromisoformat((await occupancy(admin_client, pool))["now"])
    later = (now + timedelta(hours=2)).isoformat()
    held = await reserve(admin_client, reservation(pool, 2, resources={"cpu": 4}))
    await reserve(admin_client, reservation(pool, 1, resources={"cpu": 8}, start=later, duration="1h"))
    assert [a["nodeId"] for a in held["allocations"]] == [node]
    item, view = await usage(admin_client, pool, node)
    busy = [{"class": "gpu", "total": 4, "allocated": 2, "free": 1, "unhealthy": 1}]
    assert item["deviceClasses"] == view["deviceClasses"] == busy  # the later one holds nothing now
    assert (
        item["scalars"]
        == view["scalars"]
        == [{"resource": "cpu", "capacity": 15, "allocated": 4, "free": 11}]
    )
    assert view["resources"]["cpu"]["allocated"] == 4  # the view's own resources agree
    untouched, _ = await usage(admin_client, pool, other)
    assert untouched["deviceClasses"] == [
        {"class": "gpu", "total": 2, "allocated": 0, "free": 2, "unhealthy": 0}
    ]
    assert untouched["scalars"] == []

    assert (await admin_client.post(f"/v1/reservations/{held['id']}/release")).status_code == 200
    item, view = await usage(admin_client, pool, node)
    assert item["deviceClasses"] == view["deviceClasses"] == idle
    assert (
        item["scalars"]
        == view["scalars"]
        == [{"resource": "cpu", "capacity": 15, "allocated": 0, "free": 15}]
    )


async def test_a_node_lost_shows_in_the_list(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client, "usage-lost")
    node = (await add_node(admin_client, pool, gpu_node("l1", 1)))["id"]
    r = await admin_client.post(f"/v1/nodes/{node}/health", json={"ready": False, "heartbeatLost": True})
    assert r.status_code == 200, r.text
    item, _ = await usage(admin_client, pool, node)
    assert (item["ready"], item["heartbeatLost"]) == (False, True)
    assert item["noScheduleReasons"] == ["not ready", "heartbeat lost"]
