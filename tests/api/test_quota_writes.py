"""Quota writes are exact (docs/quota.md, "Writing limits"): a name no node of the pool has is 422 at
``limits.<name>`` naming the pool's resources (accepted with a warning in a pool without nodes), a
fractional device-class limit is 422, a PUT that drops a limit says so, and a refused write changes
nothing."""

from __future__ import annotations

import httpx

from tests.factories import add_node, gpu_node, make_pool


async def _limits(client: httpx.AsyncClient, pool: str, tenant: str = "acme") -> dict:
    return (await client.get(f"/v1/tenants/{tenant}/quotas/{pool}")).json()["limits"]


async def test_unknown_resource_is_422_naming_the_pool_resources(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("n1", 2))
    assert (
        await admin_client.put(f"/v1/tenants/acme/quotas/{pool}", json={"limits": {"gpu": 4}})
    ).status_code == 200
    r = await admin_client.put(f"/v1/tenants/acme/quotas/{pool}", json={"limits": {"gpux": 4}})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "INVALID_INPUT"
    assert error["details"]["path"] == "limits.gpux"
    assert error["details"]["resources"] == ["cpu", "gpu", "memory"]
    assert "cpu, gpu, memory" in error["message"]
    assert await _limits(admin_client, pool) == {"gpu": 4}  # nothing changed: the gpu limit is still there


async def test_fractional_device_class_limit_is_422(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("n1", 2))
    r = await admin_client.put(f"/v1/tenants/acme/quotas/{pool}", json={"limits": {"gpu": 1.5, "cpu": 2}})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"]["path"] == "limits.gpu"
    assert await _limits(admin_client, pool) == {}
    ok = await admin_client.put(f"/v1/tenants/acme/quotas/{pool}", json={"limits": {"gpu": 2, "cpu": 1.5}})
    assert ok.status_code == 200, ok.text
    assert ok.json()["limits"] == {"gpu": 2, "cpu": 1.5}
    assert ok.json()["warnings"] == []


async def test_empty_pool_accepts_any_name_with_a_warning(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    r = await admin_client.put(f"/v1/tenants/acme/quotas/{pool}", json={"limits": {"tpu": 4}})
    assert r.status_code == 200, r.text
    assert r.json()["limits"] == {"tpu": 4}
    [warning] = r.json()["warnings"]
    assert warning.startswith("limits.tpu: pool has no nodes yet")


async def test_put_replaces_and_names_each_dropped_limit(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("n1", 2))
    first = await admin_client.put(f"/v1/tenants/acme/quotas/{pool}", json={"limits": {"gpu": 4, "cpu": 8}})
    assert first.json()["warnings"] == []
    r = await admin_client.put(f"/v1/tenants/acme/quotas/{pool}", json={"limits": {"memory": 100}})
    assert r.status_code == 200, r.text
    assert r.json()["limits"] == {"memory": 100}
    assert r.json()["warnings"] == [
        "limits.cpu: the limit of 8 was removed: cpu is now unlimited",
        "limits.gpu: the limit of 4 was removed: gpu is now unlimited",
    ]
    assert await _limits(admin_client, pool) == {"memory": 100}
