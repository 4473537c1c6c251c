"""Earliest start (issue 24, Done when 1; docs/lifecycle.md, "Earliest start"): a preview that does not fit
answers the first window at which it does, and ``start: "earliest"`` places the create there, through
HTTP on the real app. One test per case: plain, selector, gang, whole-node lease, quota."""

from __future__ import annotations

from datetime import datetime

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.controllers.lifecycle import end_passed_windows
from tests.factories import add_node, gpu_node, make_pool, reservation


async def _hold(client: httpx.AsyncClient, pool: str, gpus: int, duration: str, **extra: object) -> dict:
    """Another tenant's placed reservation of ``gpus`` GPUs for ``duration``, from now; its view."""
    body = reservation(pool, gpus, tenant=str(extra.pop("tenant", "other")), duration=duration, **extra)
    view = (await client.post("/v1/reservations", json=body)).json()
    assert view["status"] == "placed", view
    return view


def _end(view: dict) -> datetime:
    return datetime.fromisoformat(view["allocations"][0]["end"])


async def test_preview_answers_the_booking_end_and_earliest_places_there(
    admin_client: httpx.AsyncClient,
) -> None:
    pool = await make_pool(admin_client)
    node = await add_node(admin_client, pool, gpu_node("e1", 8))
    held = await _hold(admin_client, pool, 4, "1h")

    body = reservation(pool, 8, duration="1h")
    preview = (await admin_client.post("/v1/capacity/preview", json=body)).json()
    assert preview["fits"] is False and "fits: 4 of 8 gpu free" in preview["reason"]
    earliest = preview["earliest"]
    assert datetime.fromisoformat(earliest["start"]) == _end(held)
    assert earliest["nodeId"] == node["id"] and len(earliest["atoms"]) == 8
    assert "earliestReason" not in preview and "members" not in earliest

    placed = (await admin_client.post("/v1/reservations", json={**body, "start": "earliest"})).json()
    assert placed["status"] == "placed", placed
    [alloc] = placed["allocations"]
    assert datetime.fromisoformat(alloc["start"]) == _end(held)
    assert alloc["end"] == earliest["end"] and sorted(alloc["atoms"]) == sorted(earliest["atoms"])
    assert placed["spec"]["start"] == "earliest"

    # a request that fits for its window answers no earliest at all
    fits = (await admin_client.post("/v1/capacity/preview", json=reservation(pool, 4, duration="30m"))).json()
    assert fits["fits"] is True and "earliest" not in fits


async def test_a_selector_waits_for_the_nodes_it_matches(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("h", 8, attributes={"gpuProduct": "H100"}))
    a100 = await add_node(admin_client, pool, gpu_node("a", 8, attributes={"gpuProduct": "A100"}))
    await _hold(
        admin_client, pool, 8, "1h", devices=[{"class": "gpu", "count": 8, "selector": "gpuProduct=H100"}]
    )
    later = await _hold(
        admin_client, pool, 8, "2h", devices=[{"class": "gpu", "count": 8, "selector": "gpuProduct=A100"}]
    )

    body = reservation(
        pool, 0, duration="1h", devices=[{"class": "gpu", "count": 2, "selector": "gpuProduct=A100"}]
    )
    earliest = (await admin_client.post("/v1/capacity/preview", json=body)).json()["earliest"]
    # the H100 node frees after 1 h, but the selector matches only the A100 node: 2 h
    assert datetime.fromisoformat(earliest["start"]) == _end(later) and earliest["nodeId"] == a100["id"]
    placed = (await admin_client.post("/v1/reservations", json={**body, "start": "earliest"})).json()
    assert placed["allocations"][0]["nodeId"] == a100["id"]
    assert datetime.fromisoformat(placed["allocations"][0]["start"]) == _end(later)


async def test_a_gang_waits_for_its_members_th_node(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    for i in range(3):
        await add_node(admin_client, pool, gpu_node(f"g{i}", 8))
    ends = {}
    for hours in (3, 1, 2):  # each takes a whole free node
        view = await _hold(admin_client, pool, 8, f"{hours}h")
        ends[view["allocations"][0]["nodeId"]] = _end(view)
    by_end = sorted(ends, key=lambda n: ends[n])

    body = reservation(pool, 8, duration="30m", gang={"members": 2})
    preview = (await admin_client.post("/v1/capacity/preview", json=body)).json()
    earliest = preview["earliest"]
    # two nodes are free once the second booking ends, on the two nodes that freed first
    assert datetime.fromisoformat(earliest["start"]) == ends[by_end[1]]
    assert {m["nodeId"] for m in earliest["members"]} == set(by_end[:2])
    assert earliest["nodeId"] == earliest["members"][0]["nodeId"]
    placed = (await admin_client.post("/v1/reservations", json={**body, "start": "earliest"})).json()
    assert placed["status"] == "placed", placed
    assert {a["nodeId"] for a in placed["allocations"]} == set(by_end[:2])
    assert {datetime.fromisoformat(a["start"]) for a in placed["allocations"]} == {ends[by_end[1]]}


async def test_a_lease_waits_for_a_node_that_holds_nothing(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    n1 = await add_node(admin_client, pool, gpu_node("l1", 4, cpu=64, memory=None))
    n2 = await add_node(admin_client, pool, gpu_node("l2", 4, cpu=64, memory=None))
    # one GPU held on each node: an hour on one, two hours on the other
    first = await _hold(admin_client, pool, 3, "1h")
    first_node = first["allocations"][0]["nodeId"]
    second = await _hold(admin_client, pool, 3, "2h")
    assert second["allocations"][0]["nodeId"] != first_node

    lease = reservation(pool, 1, tenant="lessee", binding="node", duration="1h")
    preview = (await admin_client.post("/v1/capacity/preview", json=lease)).json()
    assert preview["fits"] is False
    earliest = preview["earliest"]
    assert datetime.fromisoformat(earliest["start"]) == _end(first) and earliest["nodeId"] == first_node
    assert len(earliest["atoms"]) == 4  # the node, whole
    placed = (await admin_client.post("/v1/reservations", json={**lease, "start": "earliest"})).json()
    assert placed["status"] == "placed" and placed["allocations"][0]["nodeId"] == first_node
    assert datetime.fromisoformat(placed["allocations"][0]["start"]) == _end(first)
    assert {n1["id"], n2["id"]} >= {first_node}


async def test_a_quota_limit_reached_until_a_time(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("q1", 8))
    await add_node(admin_client, pool, gpu_node("q2", 8))
    r = await admin_client.put(f"/v1/tenants/acme/quotas/{pool}", json={"limits": {"gpu": 8}})
    assert r.status_code == 200, r.text
    own = await _hold(admin_client, pool, 6, "1h", tenant="acme")  # acme holds 6 of its 8 for an hour

    body = reservation(pool, 4, duration="1h")  # room on the nodes now, not in acme's quota
    refused = await admin_client.post("/v1/reservations", json=body)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "QUOTA_EXCEEDED"
    placed = (await admin_client.post("/v1/reservations", json={**body, "start": "earliest"})).json()
    assert placed["status"] == "placed", placed
    assert datetime.fromisoformat(placed["allocations"][0]["start"]) == _end(own)

    # the preview of a request that does not fit counts the quota too: 12 GPUs fit on no node now; its
    # earliest is when both the nodes and acme's quota (limit raised to 16) have room
    await admin_client.put(f"/v1/tenants/acme/quotas/{pool}", json={"limits": {"gpu": 16}})
    wide = reservation(pool, 8, duration="1h", gang={"members": 2})
    earliest = (await admin_client.post("/v1/capacity/preview", json=wide)).json()["earliest"]
    assert datetime.fromisoformat(earliest["start"]) == datetime.fromisoformat(
        placed["allocations"][0]["end"]
    )


async def test_nothing_within_the_lead_is_null_with_a_reason_and_a_pending_create(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("c1", 8, cordoned=True))
    body = reservation(pool, 8, duration="1h")
    preview = (await admin_client.post("/v1/capacity/preview", json=body)).json()
    assert preview["fits"] is False and preview["earliest"] is None
    assert preview["earliestReason"].startswith("earliest: no node can hold it at any start up to ")
    pending = (await admin_client.post("/v1/reservations", json={**body, "start": "earliest"})).json()
    assert pending["status"] == "pending"
    message = pending["conditions"][0]["message"]
    assert message.startswith("earliest: no node can hold it") and "when a wake edge lets it fit" in message
    # it waits like a request without a start: no passed start ends it
    assert pending["id"] not in await end_passed_windows(engine)
    assert (await admin_client.get(f"/v1/reservations/{pending['id']}")).json()["status"] == "pending"


async def test_a_bulk_item_with_start_earliest_is_placed_at_its_window(
    admin_client: httpx.AsyncClient,
) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("b1", 8))
    held = await _hold(admin_client, pool, 4, "1h")
    items = [
        {**reservation(pool, 8, duration="1h"), "start": "earliest"},
        reservation(pool, 2, duration="1h"),  # a plain item beside it, in the batch transaction
    ]
    r = await admin_client.post("/v1/reservations/batch", json={"items": items})
    assert r.status_code == 200, r.text
    earliest, plain = (item["reservation"] for item in r.json()["items"])
    assert earliest["status"] == "placed" and plain["status"] == "placed"
    # the plain items are committed first (their batch), then the earliest item searches: it waits for
    # the later of the two holdings in the way
    assert _end(plain) > _end(held)
    assert datetime.fromisoformat(earliest["allocations"][0]["start"]) == _end(plain)
    assert earliest["spec"]["start"] == "earliest"


async def test_an_earliest_window_at_or_after_the_deadline_is_not_taken(
    admin_client: httpx.AsyncClient,
) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("d1", 8))
    held = await _hold(admin_client, pool, 4, "1h")
    body = {**reservation(pool, 8, duration="1h"), "start": "earliest"}
    before = await admin_client.post(
        "/v1/reservations", json={**body, "deadline": held["allocations"][0]["end"]}
    )
    view = before.json()
    assert before.status_code == 201 and view["status"] == "pending", view
    assert view["allocations"] == [] and "at or after the deadline" in view["conditions"][0]["message"]
    later = _end(held).replace(microsecond=0).isoformat()
    after = (
        await admin_client.post(
            "/v1/reservations",
            json={**body, "idempotencyKey": "later", "deadline": later.replace("+00:00", "Z")},
        )
    ).json()
    assert after["status"] == "pending"  # the window would start after a deadline rounded down

    ok = (
        await admin_client.post(
            "/v1/reservations",
            json={
                **body,
                "idempotencyKey": "ok",
                "deadline": (_end(held).replace(year=_end(held).year + 1)).isoformat(),
            },
        )
    ).json()
    assert ok["status"] == "placed" and datetime.fromisoformat(ok["allocations"][0]["start"]) == _end(held)
