"""``GET /v1/reservations?poolId=&nodeId=&status=`` through HTTP on real PostgreSQL (docs/api.md,
"Reservations and preview"): each filter, their combination (AND), paging under a filter, a tenant key's
scope, an unknown pool or node (an empty page) and a bad status (422 at ``status``, nothing changed)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.test_occupancy import reserve, tenant_client
from tests.factories import add_node, gpu_node, make_pool, reservation

A, B = "tenant-a", "tenant-b"


async def ids(client: httpx.AsyncClient, **query: str) -> set[str]:
    r = await client.get("/v1/reservations", params=query)
    assert r.status_code == 200, r.text
    assert r.json()["nextCursor"] is None
    return {item["id"] for item in r.json()["items"]}


@pytest.fixture
async def world(admin_client: httpx.AsyncClient) -> dict[str, Any]:
    """Pool p1 with nodes n1 (rack a) and n2 (rack b), pool p2 with m1; r1 (A, n1), r2 (B, n2),
    r3 (A, p2), r4 (A, p1, pending), r5 (A, n2, released)."""
    p1, p2 = await make_pool(admin_client, "f1"), await make_pool(admin_client, "f2")
    n1 = (await add_node(admin_client, p1, gpu_node("fa", 4, labels={"rack": "a"})))["id"]
    n2 = (await add_node(admin_client, p1, gpu_node("fb", 4, labels={"rack": "b"})))["id"]
    await add_node(admin_client, p2, gpu_node("fm", 2))
    on_a = {"selector": "rack = a"}

    def gpus(n: int, sel: dict[str, str] | None = None) -> list[dict[str, Any]]:
        return [{"class": "gpu", "count": n, **(sel or {})}]

    r1 = await reserve(admin_client, reservation(p1, tenant=A, devices=gpus(2, on_a)))
    r2 = await reserve(admin_client, reservation(p1, tenant=B, devices=gpus(2, {"selector": "rack = b"})))
    r3 = await reserve(admin_client, reservation(p2, tenant=A))
    r4 = await reserve(admin_client, reservation(p1, tenant=A, devices=gpus(4, on_a)), status="pending")
    r5 = await reserve(admin_client, reservation(p1, tenant=A, devices=gpus(1, {"selector": "rack = b"})))
    assert (await admin_client.post(f"/v1/reservations/{r5['id']}/release")).status_code == 200
    assert [a["nodeId"] for a in r1["allocations"]] == [n1] and [a["nodeId"] for a in r5["allocations"]] == [
        n2
    ]
    named = {"r1": r1, "r2": r2, "r3": r3, "r4": r4, "r5": r5}
    return {"p1": p1, "p2": p2, "n1": n1, "n2": n2, **{k: v["id"] for k, v in named.items()}}


def of(world: dict[str, Any], *names: str) -> set[str]:
    return {world[n] for n in names}


async def test_each_filter_and_their_combination(
    admin_client: httpx.AsyncClient, world: dict[str, Any]
) -> None:
    w = world
    assert await ids(admin_client, poolId=w["p1"]) == of(w, "r1", "r2", "r4", "r5")
    assert await ids(admin_client, poolId=w["p2"]) == of(w, "r3")
    assert await ids(admin_client, nodeId=w["n1"]) == of(w, "r1")
    assert await ids(admin_client, nodeId=w["n2"]) == of(w, "r2", "r5")  # a released one had its allocation
    assert await ids(admin_client, status="pending") == of(w, "r4")
    assert await ids(admin_client, poolId=w["p1"], status="placed") == of(w, "r1", "r2")
    assert await ids(admin_client, nodeId=w["n2"], status="released", tenantId=A) == of(w, "r5")
    assert await ids(admin_client, poolId=w["p2"], nodeId=w["n1"]) == set()  # the node is in another pool
    assert await ids(admin_client, poolId="pool_nope") == set()  # unknown: an empty page, as a tenant
    assert await ids(admin_client, nodeId="node_nope") == set()


async def test_paging_keeps_the_filter(admin_client: httpx.AsyncClient, world: dict[str, Any]) -> None:
    seen: list[str] = []
    query: dict[str, str] = {"poolId": world["p1"], "tenantId": A, "limit": "1"}
    while True:
        page = (await admin_client.get("/v1/reservations", params=query)).json()
        seen += [item["id"] for item in page["items"]]
        if page["nextCursor"] is None:
            break
        query["cursor"] = page["nextCursor"]
    assert len(seen) == 3 and set(seen) == of(world, "r1", "r4", "r5")


async def test_a_tenant_key_sees_its_own_only(
    admin_client: httpx.AsyncClient, client_for: Any, world: dict[str, Any]
) -> None:
    async with await tenant_client(admin_client, client_for, A, world["p1"]) as as_a:
        assert await ids(as_a, poolId=world["p1"]) == of(world, "r1", "r4", "r5")
        assert await ids(as_a, nodeId=world["n2"]) == of(world, "r5")  # not B's r2 on the same node
        assert await ids(as_a, poolId=world["p2"]) == of(world, "r3")  # its own work, whatever the pool
        r = await as_a.get("/v1/reservations", params={"poolId": world["p1"], "tenantId": B})
        assert r.status_code == 403 and r.json()["error"]["details"]["tenantId"] == A, r.text


@pytest.mark.parametrize(
    "query", [{"status": "running"}, {"status": ""}, {"poolId": "p" * 129}, {"nodeId": "n" * 129}]
)
async def test_a_bad_filter_is_422_at_its_name(
    admin_client: httpx.AsyncClient, world: dict[str, Any], query: dict[str, str]
) -> None:
    before = await ids(admin_client)
    r = await admin_client.get("/v1/reservations", params=query)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == next(iter(query)), r.text
    assert await ids(admin_client) == before
