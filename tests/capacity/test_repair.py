"""BookingRepair (issue 12, Done when 5): marking a booked atom unhealthy through the health route moves
its allocation for the rest of its window: to another atom of the node when one fits, else to another
node (selector and NVLink respected), else the reservation goes pending with the repair reason. In every
case the Repaired condition names old and new atoms and nodes, and no booking remains on the atom."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.factories import add_node, gpu_node, make_pool, reservation

H100 = {"matchExpressions": [{"key": "gpuProduct", "op": "In", "values": ["H100-SXM5-80GB"]}]}


async def _repaired(client: httpx.AsyncClient, reservation_id: str, within: float = 5.0) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        view = (await client.get(f"/v1/reservations/{reservation_id}")).json()
        if any(c["type"] == "Repaired" for c in view["conditions"]) or time.monotonic() > deadline:
            assert any(c["type"] == "Repaired" for c in view["conditions"]), view
            return view
        await asyncio.sleep(0.02)


async def _mark_unhealthy(client: httpx.AsyncClient, node_id: str, atom: str) -> None:
    body = {"devices": [{"id": atom, "healthy": False}]}
    assert (await client.post(f"/v1/nodes/{node_id}/health", json=body)).status_code == 200


async def _live_bookings_on(engine: AsyncEngine, atom: str) -> int:
    async with engine.connect() as conn:
        return (
            await conn.execute(
                sa.text(
                    "SELECT count(*) FROM device_bookings WHERE device_id = :a AND upper(during) > now()"
                ),
                {"a": atom},
            )
        ).scalar_one()


async def test_repair_moves_to_another_atom_of_the_node(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    node = await add_node(admin_client, pool, gpu_node("same", 4))
    placed = (await admin_client.post("/v1/reservations", json=reservation(pool, 2))).json()
    [alloc] = placed["allocations"]
    broken = alloc["atoms"][0]
    await _mark_unhealthy(admin_client, node["id"], broken)
    view = await _repaired(admin_client, placed["id"])
    assert view["status"] == "placed"
    old, new = view["allocations"]
    assert old["id"] == alloc["id"] and old["releasedAt"] is not None  # history up to the repair
    assert new["nodeId"] == node["id"] and broken not in new["atoms"] and len(new["atoms"]) == 2
    assert new["end"] == alloc["end"]  # the rest of the same window
    [repaired] = [c for c in view["conditions"] if c["type"] == "Repaired"]
    assert repaired["oldAtoms"] == alloc["atoms"] and repaired["newAtoms"] == new["atoms"]
    assert repaired["oldNodeId"] == repaired["newNodeId"] == node["id"] and repaired["at"]
    assert "same" in repaired["message"]
    assert await _live_bookings_on(engine, broken) == 0


async def test_repair_tries_the_same_node_first_when_others_have_room(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """With another empty node in the pool, the work still stays on its node when that node has room (the
    placer once replaced repair's exclusion of the other nodes with its own lost-race exclusions)."""
    pool = await make_pool(admin_client)
    for i in range(2):
        await add_node(admin_client, pool, gpu_node(f"twin-{i}", 8))
    for attempt in range(3):  # the seeded pick among equals would choose the other node about half the time
        placed = (
            await admin_client.post("/v1/reservations", json=reservation(pool, 2, key=f"t{attempt}"))
        ).json()
        [alloc] = placed["allocations"]
        await _mark_unhealthy(admin_client, alloc["nodeId"], alloc["atoms"][0])
        view = await _repaired(admin_client, placed["id"])
        [repaired] = [c for c in view["conditions"] if c["type"] == "Repaired"]
        assert repaired["newNodeId"] == repaired["oldNodeId"] == alloc["nodeId"], repaired
        # the held allocation (not only the condition) stays on the node, off the broken atom
        [held] = [a for a in view["allocations"] if a["releasedAt"] is None]
        assert held["nodeId"] == alloc["nodeId"] and alloc["atoms"][0] not in held["atoms"], view
        assert (await admin_client.post(f"/v1/reservations/{placed['id']}/release")).status_code == 200


async def test_repair_moves_to_another_node_respecting_selector_and_nvlink(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    a = await add_node(admin_client, pool, gpu_node("na", 2))
    b = await add_node(admin_client, pool, gpu_node("nb", 2, cordoned=True))
    # free, but no: another product (selector), and PCIe only (nvlink-all)
    await add_node(admin_client, pool, gpu_node("nc", 2, attributes={"gpuProduct": "A100", "vramGiB": 80}))
    await add_node(admin_client, pool, gpu_node("nd", 2, link="SYS"))
    body = reservation(
        pool, 0, devices=[{"class": "gpu", "count": 2, "selector": H100, "topology": "nvlink-all"}]
    )
    placed = (await admin_client.post("/v1/reservations", json=body)).json()
    assert placed["status"] == "placed", placed
    assert placed["allocations"][0]["nodeId"] == a["id"]  # nb cordoned, nc and nd do not fit
    assert (await admin_client.post(f"/v1/nodes/{b['id']}/uncordon")).status_code == 200
    broken = placed["allocations"][0]["atoms"][1]
    await _mark_unhealthy(admin_client, a["id"], broken)
    view = await _repaired(admin_client, placed["id"])
    assert view["status"] == "placed"
    new = view["allocations"][-1]
    assert new["nodeId"] == b["id"] and sorted(new["atoms"]) == ["nb-GPU0", "nb-GPU1"]
    [repaired] = [c for c in view["conditions"] if c["type"] == "Repaired"]
    assert repaired["oldNodeId"] == a["id"] and repaired["newNodeId"] == b["id"]
    assert repaired["newAtoms"] == new["atoms"]
    assert await _live_bookings_on(engine, broken) == 0
    # the healthy atom left on na is free again from the repair on
    assert await _live_bookings_on(engine, placed["allocations"][0]["atoms"][0]) == 0


async def test_repair_without_room_goes_pending(admin_client: httpx.AsyncClient, engine: AsyncEngine) -> None:
    pool = await make_pool(admin_client)
    node = await add_node(admin_client, pool, gpu_node("only", 2))
    placed = (await admin_client.post("/v1/reservations", json=reservation(pool, 2, tenant="rp"))).json()
    broken = placed["allocations"][0]["atoms"][0]
    await _mark_unhealthy(admin_client, node["id"], broken)
    view = await _repaired(admin_client, placed["id"])
    assert view["status"] == "pending"
    [unschedulable] = [c for c in view["conditions"] if c["type"] == "Unschedulable"]
    assert unschedulable["message"] == "repair: no node fits (1 node): 1 × fits: 1 of 2 gpu free"
    [repaired] = [c for c in view["conditions"] if c["type"] == "Repaired"]
    assert repaired["newNodeId"] is None and repaired["newAtoms"] == []
    assert repaired["oldAtoms"] == placed["allocations"][0]["atoms"]
    assert await _live_bookings_on(engine, broken) == 0
    assert all(a["releasedAt"] for a in view["allocations"])  # its remaining holdings are freed
    quota = (await admin_client.get(f"/v1/tenants/rp/quotas/{pool}")).json()
    assert quota["used"].get("gpu", 0) == 0
    # health back is a wake edge: the repaired reservation is placed again, charged for its new window
    # (its old quota holding once collided with the new charge and failed every wake of the pool)
    healthy = {"devices": [{"id": broken, "healthy": True}]}
    assert (await admin_client.post(f"/v1/nodes/{node['id']}/health", json=healthy)).status_code == 200
    deadline = time.monotonic() + 5
    while (view := (await admin_client.get(f"/v1/reservations/{placed['id']}")).json())["status"] != "placed":
        assert time.monotonic() < deadline, view
        await asyncio.sleep(0.05)
    quota = (await admin_client.get(f"/v1/tenants/rp/quotas/{pool}")).json()
    assert quota["used"]["gpu"] == 2
