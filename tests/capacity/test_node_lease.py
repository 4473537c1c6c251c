"""Whole-node leases (issue 12, Done when 7): ``binding: node`` takes every atom and all scalar room of the
node for its window, nothing else lands on the node in that window, a lease cannot take a node that holds
anything in it, and its preview lists the nodes it would take with all their atoms."""

from __future__ import annotations

import httpx

from tests.factories import add_node, gpu_node, make_pool, reservation, wait_for_status


async def test_a_lease_takes_the_whole_node_for_its_window(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    n1 = await add_node(admin_client, pool, gpu_node("l1", 4, cpu=64, memory=None))
    n2 = await add_node(admin_client, pool, gpu_node("l2", 4, cpu=64, memory=None))
    lease = reservation(pool, 1, tenant="lessee", binding="node")

    preview = (await admin_client.post("/v1/capacity/preview", json=lease)).json()
    assert preview["fits"] is True
    assert {c["nodeId"] for c in preview["candidates"]} == {n1["id"], n2["id"]}
    for c in preview["candidates"]:  # the nodes it would take, whole
        assert sorted(c["atoms"]) == [f"{c['nodeName']}-GPU{i}" for i in range(4)]

    leased = (await admin_client.post("/v1/reservations", json=lease)).json()
    assert leased["status"] == "placed"
    [alloc] = leased["allocations"]
    assert len(alloc["atoms"]) == 4 and alloc["resources"] == {"cpu": 64}
    taken, other = (n1, n2) if alloc["nodeId"] == n1["id"] else (n2, n1)

    # another tenant's work lands on the other node only: GPUs, and cpu without GPUs
    gpus = (await admin_client.post("/v1/reservations", json=reservation(pool, 2, tenant="b"))).json()
    cpu = (
        await admin_client.post(
            "/v1/reservations", json=reservation(pool, 0, tenant="b", resources={"cpu": 1})
        )
    ).json()
    for view in (gpus, cpu):
        assert view["status"] == "placed" and view["allocations"][0]["nodeId"] == other["id"], view
    # the other node holds something now: a second lease cannot take it, nor the leased one
    second = (
        await admin_client.post("/v1/reservations", json=reservation(pool, 1, tenant="c", binding="node"))
    ).json()
    assert second["status"] == "pending"
    message = second["conditions"][0]["message"]
    # the leased node fails fits first (no atom free), the other the lease rule (it holds 2 of 4)
    assert (
        message
        == "no node fits (2 nodes): 1 × fits: 0 of 4 gpu free; 1 × lease: 2 of 4 atoms booked in the window"
    )
    full = (await admin_client.post("/v1/reservations", json=reservation(pool, 3, tenant="b"))).json()
    assert full["status"] == "pending" and "fits: 0 of 4 gpu free" in full["conditions"][0]["message"]

    # the release frees the node and wakes the pending ones, oldest first: the second lease takes it whole
    assert (await admin_client.post(f"/v1/reservations/{leased['id']}/release")).status_code == 200
    woken = await wait_for_status(admin_client, second["id"], "placed")
    assert woken["allocations"][0]["nodeId"] == taken["id"] and len(woken["allocations"][0]["atoms"]) == 4
    assert (await admin_client.get(f"/v1/reservations/{full['id']}")).json()["status"] == "pending"
