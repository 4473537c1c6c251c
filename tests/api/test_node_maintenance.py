"""Drain, undrain and delete a node (docs/operating.md, "Maintenance: drain and delete"): a drained node
takes no new work and keeps what it holds, shows ``draining`` then ``drained``; with ``reschedule`` its
future reservations move elsewhere and current work stays; a delete is 409 while the node holds current
or future work, 204 once it holds none, and the node's history stays readable."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.tables import devices
from tests.agent_host import FIRST_UUID, SECOND_UUID
from tests.api.test_agents import hello_body
from tests.api.test_occupancy import occupancy, reserve
from tests.api.test_usage import HOUR, hold, period, split, usage
from tests.capacity.helpers import db_time
from tests.capacity.invariants import violations
from tests.factories import add_node, gpu_node, make_pool, reservation


async def node(client: httpx.AsyncClient, node_id: str) -> dict[str, Any]:
    r = await client.get(f"/v1/nodes/{node_id}")
    assert r.status_code == 200, r.text
    return r.json()


async def get_reservation(client: httpx.AsyncClient, reservation_id: str) -> dict[str, Any]:
    r = await client.get(f"/v1/reservations/{reservation_id}")
    assert r.status_code == 200, r.text
    return r.json()


def live(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for a in answer["allocations"] if a["releasedAt"] is None]


async def post(client: httpx.AsyncClient, path: str, body: Any = None, status: int = 200) -> dict[str, Any]:
    r = await client.post(path, json=body)
    assert r.status_code == status, r.text
    return r.json()


def later(hours: float) -> str:
    return (datetime.now(UTC) + timedelta(hours=hours)).isoformat()


async def test_a_drained_node_takes_no_new_work_and_keeps_its_current_work(
    admin_client: httpx.AsyncClient,
) -> None:
    pool = await make_pool(admin_client, "drain")
    n1 = (await add_node(admin_client, pool, gpu_node("d1", 4)))["id"]
    current = await reserve(admin_client, reservation(pool, 2, duration="1h"))
    [before] = live(current)
    assert (await node(admin_client, n1))["drain"] is None

    drained = await post(admin_client, f"/v1/nodes/{n1}/drain")
    assert drained["drain"] == "draining" and drained["rescheduled"] == []
    assert drained["noScheduleReasons"] == ["draining"]
    again = await post(admin_client, f"/v1/nodes/{n1}/drain", {"reschedule": False})  # idempotent
    assert again["noScheduleReasons"] == ["draining"]
    [item] = (await admin_client.get(f"/v1/pools/{pool}/nodes")).json()["items"]
    assert item["drain"] == "draining"

    # a create that would fit only there waits, naming the drain; a whole-node lease is refused too
    waiting = await reserve(admin_client, reservation(pool, 1, duration="1h"), status="pending")
    [unschedulable] = [c for c in waiting["conditions"] if c["type"] == "Unschedulable"]
    assert "draining" in unschedulable["message"], unschedulable
    lease = await post(
        admin_client, "/v1/capacity/preview", reservation(pool, 1, binding="node", duration="1h")
    )
    assert lease["fits"] is False and "draining" in lease["reason"], lease

    # the current work keeps its window
    assert live(await get_reservation(admin_client, current["id"])) == [before]

    # its window ended by the release: nothing current or future is placed there
    await post(admin_client, f"/v1/reservations/{current['id']}/release")
    assert (await node(admin_client, n1))["drain"] == "drained"

    undrained = await post(admin_client, f"/v1/nodes/{n1}/undrain")
    assert (undrained["drain"], undrained["noScheduleReasons"]) == (None, [])
    assert (await post(admin_client, f"/v1/nodes/{n1}/undrain"))["drain"] is None  # idempotent
    for path in ("drain", "undrain"):
        r = await admin_client.post(f"/v1/nodes/node_nope/{path}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND", r.text
    r = await admin_client.post(f"/v1/nodes/{n1}/drain", json={"reschedule": "yes"})
    assert r.status_code == 422 and r.json()["error"]["details"]["path"] == "reschedule", r.text
    assert (await node(admin_client, n1))["drain"] is None  # the refused drain changed nothing


async def test_reschedule_moves_future_work_and_leaves_current_work(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool = await make_pool(admin_client, "resched")
    n1 = (await add_node(admin_client, pool, gpu_node("r1", 4)))["id"]
    n2 = (await add_node(admin_client, pool, gpu_node("r2", 4, cordoned=True)))["id"]  # all on n1
    current = await reserve(admin_client, reservation(pool, 4, duration="3h"))
    future = await reserve(admin_client, reservation(pool, 2, start=later(4), duration="1h"))
    [cur_before] = live(current)
    [fut_before] = live(future)
    assert cur_before["nodeId"] == fut_before["nodeId"] == n1
    await post(admin_client, f"/v1/nodes/{n2}/uncordon")

    drained = await post(admin_client, f"/v1/nodes/{n1}/drain", {"reschedule": True})
    assert drained["rescheduled"] == [
        {"reservationId": future["id"], "result": "other_node", "fromNodeId": n1, "toNodeId": n2}
    ]
    assert drained["drain"] == "draining"  # the current work is still there

    moved = await get_reservation(admin_client, future["id"])
    [fut_after] = live(moved)
    assert moved["status"] == "placed" and fut_after["nodeId"] == n2
    assert (fut_after["start"], fut_after["end"]) == (fut_before["start"], fut_before["end"])
    [repaired] = [c for c in moved["conditions"] if c["type"] == "Repaired"]
    assert repaired["reason"] == "NodeDraining" and "r1" in repaired["message"], repaired
    assert live(await get_reservation(admin_client, current["id"])) == [cur_before]
    assert await violations(engine) == {}


async def test_reschedule_sends_back_to_pending_what_fits_nowhere_else(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool = await make_pool(admin_client, "resched-pending")
    n1 = (await add_node(admin_client, pool, gpu_node("p1", 4)))["id"]
    await add_node(admin_client, pool, gpu_node("p2", 2, cordoned=True))
    future = await reserve(admin_client, reservation(pool, 4, start=later(2), duration="1h"))
    drained = await post(admin_client, f"/v1/nodes/{n1}/drain", {"reschedule": True})
    assert [(m["reservationId"], m["result"], m["toNodeId"]) for m in drained["rescheduled"]] == [
        (future["id"], "pending", None)
    ]
    assert drained["drain"] == "drained"  # only future work was there, and it left
    assert (await get_reservation(admin_client, future["id"]))["status"] == "pending"
    assert await violations(engine) == {}


async def test_delete_refuses_a_busy_node_and_keeps_the_history_of_a_deleted_one(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool = await make_pool(admin_client, "delete")
    n1 = (await add_node(admin_client, pool, gpu_node("x1", 4)))["id"]
    n2 = (await add_node(admin_client, pool, gpu_node("x2", 4, cordoned=True)))["id"]
    work = await reserve(admin_client, reservation(pool, 2, duration="1h"))
    future = await reserve(admin_client, reservation(pool, 1, start=later(5), duration="1h"))
    listed_before = (await admin_client.get(f"/v1/pools/{pool}/nodes")).json()
    view_before = await node(admin_client, n1)

    r = await admin_client.delete(f"/v1/nodes/{n1}")
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert error["code"] == "CONFLICT" and work["id"] in error["message"] and future["id"] in error["message"]
    assert "2 reservations" in error["message"], error
    assert error["details"] == {"nodeId": n1, "reservationIds": [work["id"], future["id"]], "count": 2}
    # nothing changed
    assert (await admin_client.get(f"/v1/pools/{pool}/nodes")).json() == listed_before
    view_after = await node(admin_client, n1)
    assert {k: v for k, v in view_after.items() if k != "agent"} == {
        k: v for k, v in view_before.items() if k != "agent"
    }

    await post(admin_client, f"/v1/nodes/{n1}/drain")
    await post(admin_client, f"/v1/reservations/{work['id']}/release")
    await post(admin_client, f"/v1/reservations/{future['id']}/release")
    assert (await node(admin_client, n1))["drain"] == "drained"
    r = await admin_client.delete(f"/v1/nodes/{n1}")
    assert r.status_code == 204 and r.content == b"", r.text

    # gone from the node routes, the pool's list, counts, occupancy and placement
    for method, path in (("GET", ""), ("POST", "/drain"), ("POST", "/cordon"), ("DELETE", "")):
        r = await admin_client.request(method, f"/v1/nodes/{n1}{path}")
        assert r.status_code == 404, (method, path, r.text)
    assert [n["id"] for n in (await admin_client.get(f"/v1/pools/{pool}/nodes")).json()["items"]] == [n2]
    pool_view = (await admin_client.get(f"/v1/pools/{pool}")).json()
    assert pool_view["nodeCount"] == 1 and pool_view["capacity"]["gpu"]["total"] == 4, pool_view
    assert [n["nodeId"] for n in (await occupancy(admin_client, pool))["nodes"]] == [n2]
    waiting = await reserve(admin_client, reservation(pool, 1, duration="1h"), status="pending")
    [unschedulable] = [c for c in waiting["conditions"] if c["type"] == "Unschedulable"]
    assert unschedulable["message"].startswith("no node fits (1 node):"), unschedulable
    await post(admin_client, f"/v1/reservations/{waiting['id']}/release")

    # its history stays readable: the past reservation still names its node
    history = await get_reservation(admin_client, work["id"])
    assert [a["nodeId"] for a in history["allocations"]] == [n1]

    # the name and the device ids are free for the same host registered again (an import); the ids of
    # a live node are not
    r = await admin_client.post(f"/v1/pools/{pool}/nodes", json={**gpu_node("x2", 4), "name": "x3"})
    assert r.status_code == 409 and "x2-GPU0" in r.json()["error"]["message"], r.text
    again = await add_node(admin_client, pool, gpu_node("x1", 4))
    assert again["id"] != n1 and again["name"] == "x1" and again["drain"] is None
    assert [d["id"] for d in again["devices"]] == [f"x1-GPU{i}" for i in range(4)]
    pool_view = (await admin_client.get(f"/v1/pools/{pool}")).json()
    assert pool_view["nodeCount"] == 2 and pool_view["capacity"]["gpu"]["total"] == 8, pool_view
    placed = await reserve(admin_client, reservation(pool, 4, duration="1h"))
    assert live(placed)[0]["nodeId"] == again["id"]
    assert sorted(live(placed)[0]["atoms"]) == [f"x1-GPU{i}" for i in range(4)]
    # the past reservation still names the deleted node and the ids it booked there
    assert [
        (a["nodeId"], a["atoms"]) for a in (await get_reservation(admin_client, work["id"]))["allocations"]
    ] == [(n1, history["allocations"][0]["atoms"])]
    assert await violations(engine) == {}


async def test_a_deleted_hosts_device_ids_register_again_and_its_history_stays_exact(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """The same host (the same GPU UUIDs) says Hello again after its node was deleted: a new node with
    the same device ids, bookable; the deleted node's reservation, usage and occupancy stay its own."""
    pool = await make_pool(admin_client, "again")
    old = (await post(admin_client, "/v1/nodes/hello", hello_body(pool, name="h1")))["nodeId"]
    t = (await db_time(engine)).replace(microsecond=0) - 3 * HOUR
    await hold(engine, pool, old, [FIRST_UUID], (t, t + HOUR), "acme")  # a known past hour
    work = await reserve(admin_client, reservation(pool, 2, duration="1h"))
    await post(admin_client, f"/v1/reservations/{work['id']}/release")
    history = (await get_reservation(admin_client, work["id"]))["allocations"]
    assert [(a["nodeId"], sorted(a["atoms"])) for a in history] == [(old, [FIRST_UUID, SECOND_UUID])]
    past = period(t, t + 2 * HOUR, groupBy="node")
    used = await usage(admin_client, **past)
    assert used["rows"] == [
        {"poolId": pool, "nodeId": old, "nodeName": "h1", "deviceHours": {"gpu": split(1)}, "scalarHours": {}}
    ], used
    await post(admin_client, f"/v1/nodes/{old}/drain")
    assert (await admin_client.delete(f"/v1/nodes/{old}")).status_code == 204

    again = await post(admin_client, "/v1/nodes/hello", hello_body(pool, name="h1"))
    assert again["created"] and again["nodeId"] != old
    assert [d["id"] for d in again["devices"]] == [FIRST_UUID, SECOND_UUID]
    new = again["nodeId"]
    # the history reads as before: the reservation's ids, the hours of the past window, to the second
    assert (await get_reservation(admin_client, work["id"]))["allocations"] == history
    assert await usage(admin_client, **past) == used
    # the new node's atoms show none of the deleted node's bookings
    seen = await occupancy(admin_client, pool, **{"from": t.isoformat(), "to": (t + 2 * HOUR).isoformat()})
    assert [(n["nodeId"], [a["bookings"] for a in n["atoms"]]) for n in seen["nodes"]] == [(new, [[], []])]

    # bookable: reservations land on the new node's devices (a bulk create: the batch's commit)
    items = [reservation(pool, 1, duration="1h") for _ in range(2)]
    r = await admin_client.post("/v1/reservations/batch", json={"items": items})
    assert r.status_code == 200 and [a["status"] for a in r.json()["items"]] == [201, 201], r.text
    placed = [a for item in r.json()["items"] for a in live(item["reservation"])]
    assert sorted((a["nodeId"], *a["atoms"]) for a in placed) == [(new, FIRST_UUID), (new, SECOND_UUID)]
    # a heartbeat, a Hello and an operator's health change touch the live device only
    beat = {"devices": [{"id": FIRST_UUID, "healthy": False, "reason": "xid 79"}]}
    assert (await post(admin_client, f"/v1/nodes/{new}/heartbeat", beat))["changed"] is True
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                sa.select(devices.c.node_id, devices.c.healthy, devices.c.deleted_at.is_not(None))
                .where(devices.c.id == FIRST_UUID)
                .order_by(devices.c.pk)
            )
        ).all()
    assert [tuple(r) for r in rows] == [(old, True, True), (new, False, False)]
    # the ids of a live node stay its own: another node with them is 409
    r = await admin_client.post("/v1/nodes/hello", json=hello_body(pool, name="h2"))
    assert r.status_code == 409 and r.json()["error"]["details"]["nodeId"] == new, r.text
    assert await violations(engine) == {}
