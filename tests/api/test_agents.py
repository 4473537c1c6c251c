"""Hello and heartbeat through the real app on real PostgreSQL (issue 14)."""

from __future__ import annotations

from typing import Any

import httpx
import sqlalchemy as sa
from prometheus_client import REGISTRY
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.tables import devices, node_labels, nodes, pools
from tests.agent_host import FIRST_UUID, SECOND_UUID, h200_host
from tests.factories import add_node, gpu_node, make_pool, reservation, wait_for_status

DRIVERS = [{"id": "nvidia", "version": "580.159.04", "kinds": ["gpu"]}]


def hello_body(pool: str, name: str = "h200-a", gpus: int = 2, host: int = 0, **extra: Any) -> dict[str, Any]:
    """A Hello of the H200 host; ``host`` > 0 renames its GPU UUIDs (another machine of the same kind)."""
    topo, xml = h200_host(gpus)
    if host:
        xml = xml.replace("GPU-00000000-", f"GPU-{host:08d}-")
    body: dict[str, Any] = {
        "poolId": pool,
        "name": name,
        "topo": topo,
        "nvidiaSmiXml": xml,
        "drivers": DRIVERS,
        "capabilities": ["devices.limits"],
        "intervalSeconds": 10,
        "resources": {"cpu": {"allocatable": 16}, "memory": {"allocatable": 65536}},
    }
    body.update(extra)
    return body


async def version(engine: AsyncEngine, pool: str) -> int:
    async with engine.connect() as conn:
        return (
            await conn.execute(sa.select(pools.c.inventory_version).where(pools.c.id == pool))
        ).scalar_one()


def edges(edge: str) -> float:
    return REGISTRY.get_sample_value("bc_agent_edges_total", {"edge": edge}) or 0.0


async def agent_key(admin: httpx.AsyncClient, pool: str) -> str:
    r = await admin.post(
        "/v1/api-keys",
        json={
            "principal": "agent",
            "grants": [{"action": "compute:nodes:hello", "resource": f"pool:{pool}"}],
        },
    )
    assert r.status_code == 201, r.text
    return r.json()["key"]


async def test_hello_registers_the_node_with_system_labels(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    r = await admin_client.post("/v1/nodes/hello", json=hello_body(pool))
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["created"] and answer["inventoryChanged"] and answer["warnings"] == []
    assert [d["id"] for d in answer["devices"]] == [FIRST_UUID, SECOND_UUID]
    node = (await admin_client.get(f"/v1/nodes/{answer['nodeId']}")).json()
    assert node["links"] == [{"a": FIRST_UUID, "b": SECOND_UUID, "link": "NV18"}]
    assert node["devices"][0]["attributes"]["gpuModel"] == "H200"
    assert node["devices"][0]["attributes"]["vramGiB"] == 140
    assert node["labels"]["bc.dev/driver.nvidia"] == "580.159.04"
    assert node["labels"]["bc.dev/driver-kind.nvidia.gpu"] == "1"
    assert node["labels"]["bc.dev/cap.devices.limits"] == "1"
    assert node["labels"]["gpu.model"] == "H200"
    assert all(node["labelSources"][k] == "system" for k in node["labels"])
    assert node["resources"]["cpu"]["allocatable"] == 16
    assert node["noScheduleReasons"] == []


async def test_unchanged_hello_changes_nothing_and_a_device_that_left_is_unbookable(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    first = (await admin_client.post("/v1/nodes/hello", json=hello_body(pool))).json()
    v1 = await version(engine, pool)
    again = (await admin_client.post("/v1/nodes/hello", json=hello_body(pool))).json()
    assert again["nodeId"] == first["nodeId"] and not again["created"] and not again["inventoryChanged"]
    assert await version(engine, pool) == v1

    placed = await admin_client.post("/v1/reservations", json=reservation(pool, 2))
    assert placed.json()["status"] == "placed"
    before = edges("atoms_unavailable")
    gone = (await admin_client.post("/v1/nodes/hello", json=hello_body(pool, gpus=1))).json()
    assert gone["inventoryChanged"] and await version(engine, pool) == v1 + 1
    assert {d["id"]: d["bookable"] for d in gone["devices"]} == {FIRST_UUID: True, SECOND_UUID: False}
    assert edges("atoms_unavailable") == before + 1  # the BookingRepair hook was reached
    node = (await admin_client.get(f"/v1/nodes/{first['nodeId']}")).json()
    assert node["labels"]["gpu.count"] == "1" and node["links"] == []
    # BookingRepair: 2 GPUs no longer fit on the node, the reservation goes pending; its allocation keeps
    # its history (the device row is still there) and GPU0 is free again
    res = await wait_for_status(admin_client, placed.json()["id"], "pending")
    assert sorted(res["allocations"][0]["atoms"]) == [FIRST_UUID, SECOND_UUID]
    assert res["allocations"][0]["releasedAt"] is not None
    assert any(c["type"] == "Repaired" for c in res["conditions"])
    preview = await admin_client.post("/v1/capacity/preview", json=reservation(pool, 1, tenant="other"))
    assert [c["atoms"] for c in preview.json()["candidates"]] == [[FIRST_UUID]]  # GPU1 left

    back = (await admin_client.post("/v1/nodes/hello", json=hello_body(pool))).json()
    assert back["inventoryChanged"] and all(d["bookable"] for d in back["devices"])


async def test_hello_refuses_bad_input_and_changes_nothing(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    cases = [
        (
            hello_body(pool, labels={"bc.dev/cap.binding.kubernetes": "1"}),
            422,
            "labels.bc.dev/cap.binding.kubernetes",
        ),
        (hello_body(pool, topo="\tGPU0\tGPU1\nGPU0\t X \tNV9X\nGPU1\tNV4\t X \n"), 422, "topo"),
        (hello_body(pool, nvidiaSmiXml="<nope/>"), 422, "nvidiaSmiXml"),
        (hello_body(pool, capabilities=["Bad Cap"]), 422, "capabilities.0"),
        (hello_body(pool, topo=None), 422, ""),
        (hello_body(pool, intervalSeconds=0), 422, "intervalSeconds"),
        (hello_body("pool_missing"), 404, None),
    ]
    for body, status, path in cases:
        r = await admin_client.post("/v1/nodes/hello", json=body)
        assert r.status_code == status, (path, r.text)
        if path is not None:
            assert r.json()["error"]["details"]["path"] == path
    async with engine.connect() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(nodes))).scalar_one() == 0


async def test_agent_key_acts_only_on_its_pool(
    admin_client: httpx.AsyncClient, client_for: Any, engine: AsyncEngine
) -> None:
    mine, theirs = await make_pool(admin_client), await make_pool(admin_client)
    other = (await admin_client.post("/v1/nodes/hello", json=hello_body(theirs, "other", host=1))).json()
    async with client_for(await agent_key(admin_client, mine)) as agent:
        assert (await agent.post("/v1/nodes/hello", json=hello_body(mine))).status_code == 200
        assert (await agent.post("/v1/nodes/hello", json=hello_body(theirs, "x"))).status_code == 403
        lost = [{"id": FIRST_UUID.replace("4444", "9999"), "healthy": True}]
        r = await agent.post(f"/v1/nodes/{other['nodeId']}/heartbeat", json={"devices": []})
        assert r.status_code == 403
        r = await agent.post(
            f"/v1/nodes/{other['nodeId']}/heartbeat", json={"devices": [{"id": FIRST_UUID, "healthy": False}]}
        )
        assert r.status_code == 403
        assert (
            await agent.post(f"/v1/nodes/{other['nodeId']}/heartbeat", json={"devices": lost})
        ).status_code == 403
        assert (await agent.post("/v1/pools", json={"name": "nope"})).status_code == 403
        assert (await agent.post("/v1/nodes/node_missing/heartbeat", json={"devices": []})).status_code == 404
    async with engine.connect() as conn:
        row = (
            await conn.execute(sa.select(nodes.c.last_heartbeat_at).where(nodes.c.id == other["nodeId"]))
        ).one()
        healthy = (
            (await conn.execute(sa.select(devices.c.healthy).where(devices.c.id.like("GPU-%"))))
            .scalars()
            .all()
        )
    assert row.last_heartbeat_at is not None and all(healthy)  # the refused heartbeats changed nothing
    unauth = httpx.AsyncClient(transport=admin_client._transport, base_url="http://test")
    async with unauth:
        assert (await unauth.post("/v1/nodes/hello", json=hello_body(mine))).status_code == 401
        assert (
            await unauth.post(f"/v1/nodes/{other['nodeId']}/heartbeat", json={"devices": []})
        ).status_code == 401


async def test_heartbeats_update_health_only_when_it_changed(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    node = (await admin_client.post("/v1/nodes/hello", json=hello_body(pool))).json()["nodeId"]
    v1 = await version(engine, pool)
    url = f"/v1/nodes/{node}/heartbeat"
    ok = [{"id": FIRST_UUID, "healthy": True}, {"id": SECOND_UUID, "healthy": True}]
    quiet = await admin_client.post(url, json={"devices": ok})
    assert quiet.status_code == 200 and quiet.json() == {
        "nodeId": node,
        "changed": False,
        "noScheduleReasons": [],
    }

    before = edges("atoms_unavailable")
    bad = [
        {"id": FIRST_UUID, "healthy": True},
        {"id": SECOND_UUID, "healthy": False, "reason": "row remapping failure"},
    ]
    r = (await admin_client.post(url, json={"devices": bad})).json()
    assert r["changed"] and edges("atoms_unavailable") == before + 1
    view = (await admin_client.get(f"/v1/nodes/{node}")).json()
    assert {d["id"]: d["healthy"] for d in view["devices"]} == {FIRST_UUID: True, SECOND_UUID: False}
    two = await admin_client.post("/v1/capacity/preview", json=reservation(pool, 2))
    assert "1 of 2 gpu free" in two.json()["reason"]
    assert not (await admin_client.post(url, json={"devices": bad})).json()["changed"]

    failed = (
        await admin_client.post(url, json={"devices": [], "error": "nvidia-smi failed (exit 9)"})
    ).json()
    assert failed["changed"] and failed["noScheduleReasons"] == ["not ready"]
    assert not (await admin_client.post(url, json={"devices": [], "error": "again"})).json()["changed"]
    may_fit = edges("node_may_fit")
    back = (await admin_client.post(url, json={"devices": ok})).json()
    assert back["changed"] and back["noScheduleReasons"] == [] and edges("node_may_fit") == may_fit + 1
    assert await version(engine, pool) == v1  # health is volatile: no heartbeat bumps the inventory

    unknown = await admin_client.post(url, json={"devices": [{"id": "GPU-ghost", "healthy": True}]})
    assert unknown.status_code == 422 and unknown.json()["error"]["details"]["path"] == "devices.0.id"
    twice = await admin_client.post(url, json={"devices": [ok[0], ok[0]]})
    assert twice.status_code == 422


async def test_failed_hello_is_not_ready_until_a_good_heartbeat(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    first = (await admin_client.post("/v1/nodes/hello", json=hello_body(pool))).json()
    failed = await admin_client.post(
        "/v1/nodes/hello", json=hello_body(pool, topo=None, nvidiaSmiXml=None, error="nvidia-smi: exit 9")
    )
    assert failed.status_code == 200, failed.text
    assert failed.json()["noScheduleReasons"] == ["not ready"] and len(failed.json()["devices"]) == 2
    assert failed.json()["labels"]["gpu.model"] == "H200"  # the inventory stays as it was
    r = (await admin_client.post(f"/v1/nodes/{first['nodeId']}/heartbeat", json={"devices": []})).json()
    assert r["changed"] and r["noScheduleReasons"] == []


async def test_operator_routes_never_write_system_labels(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    node = await add_node(admin_client, pool, gpu_node("plain", 1))
    key = "bc.dev/cap.binding.kubernetes"
    put = await admin_client.put(f"/v1/nodes/{node['id']}/labels", json={"labels": {"rack": "r2", key: "1"}})
    assert put.status_code == 422 and put.json()["error"]["details"]["path"] == f"labels.{key}"
    assert key in put.json()["error"]["message"]
    create = await admin_client.post(f"/v1/pools/{pool}/nodes", json=gpu_node("b", 1, labels={key: "1"}))
    assert create.status_code == 422 and create.json()["error"]["details"]["path"] == f"labels.{key}"
    topo, xml = h200_host(1)
    imp = await admin_client.post(
        f"/v1/pools/{pool}/nodes/import",
        json={"name": "c", "topo": topo, "labels": {"bc.dev/driver.nvidia": "1"}},
    )
    assert imp.status_code == 422
    view = (await admin_client.get(f"/v1/nodes/{node['id']}")).json()
    assert view["labels"] == {}  # the refused PUT changed nothing
    beat = await admin_client.post(f"/v1/nodes/{node['id']}/heartbeat", json={"devices": []})
    assert beat.status_code == 409 and "send Hello first" in beat.json()["error"]["message"]
    assert (await admin_client.get(f"/v1/pools/{pool}")).json()["nodeCount"] == 1


async def test_import_route_answers_warnings_for_damaged_topo(admin_client: httpx.AsyncClient) -> None:
    from tests.conftest import DATA

    pool = await make_pool(admin_client)
    damaged = (DATA / "damaged" / "13-2x-a100-nv12-5nic-merged-affinity.txt").read_text()
    r = await admin_client.post(f"/v1/pools/{pool}/nodes/import", json={"name": "a100-vm", "topo": damaged})
    assert r.status_code == 201, r.text
    assert len(r.json()["warnings"]) == 2 and "SY0-31,64-95" in r.json()["warnings"][0]
    assert r.json()["links"] == [{"a": "a100-vm-GPU0", "b": "a100-vm-GPU1", "link": "NV12"}]


async def _legacy_operator_label(engine: AsyncEngine, node_id: str, key: str) -> None:
    """A bc.dev/ row of source operator, as a database written before the rule could hold."""
    async with engine.begin() as conn:
        await conn.execute(
            sa.insert(node_labels).values(node_id=node_id, key=key, value="1", source="operator")
        )
        await conn.execute(sa.update(pools).values(inventory_version=pools.c.inventory_version + 1))


async def test_kubernetes_binding_places_only_on_a_node_that_advertised_it(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    plain = (await admin_client.post("/v1/nodes/hello", json=hello_body(pool, "plain"))).json()
    faker = (
        await admin_client.post("/v1/nodes/hello", json=hello_body(pool, "faker", gpus=1, host=1))
    ).json()
    await _legacy_operator_label(engine, faker["nodeId"], "bc.dev/cap.binding.kubernetes")
    kube = reservation(pool, 1, binding="kubernetes")

    pending = await admin_client.post("/v1/reservations", json=kube)
    assert pending.json()["status"] == "pending"
    message = pending.json()["conditions"][0]["message"]
    assert "labels: missing bc.dev/cap.binding.kubernetes" in message and "2 nodes" in message
    preview = (
        await admin_client.post("/v1/capacity/preview", json=reservation(pool, 1, binding="kubernetes"))
    ).json()
    assert preview["fits"] is False and "labels: missing bc.dev/cap.binding.kubernetes" in preview["reason"]

    body = hello_body(pool, "kube", host=2, capabilities=["binding.kubernetes", "devices.limits"])
    kube_node = (await admin_client.post("/v1/nodes/hello", json=body)).json()["nodeId"]
    preview = (
        await admin_client.post("/v1/capacity/preview", json=reservation(pool, 1, binding="kubernetes"))
    ).json()
    assert preview["fits"] and {c["nodeId"] for c in preview["candidates"]} == {kube_node}
    # the Hello that created the node is a wake edge: the pending reservation takes one of its 2 GPUs
    woken = await wait_for_status(admin_client, pending.json()["id"], "placed")
    assert woken["allocations"][0]["nodeId"] == kube_node
    placed = (
        await admin_client.post("/v1/reservations", json=reservation(pool, 1, binding="kubernetes"))
    ).json()
    assert placed["status"] == "placed" and placed["allocations"][0]["nodeId"] == kube_node
    full = (
        await admin_client.post("/v1/reservations", json=reservation(pool, 1, binding="kubernetes"))
    ).json()
    assert full["status"] == "pending"
    device = (await admin_client.post("/v1/reservations", json=reservation(pool, 1))).json()
    assert device["status"] == "placed" and device["allocations"][0]["nodeId"] in {
        plain["nodeId"],
        faker["nodeId"],
    }


async def test_host_resources_need_devices_limits_when_enforced(
    database_url: str, clean_db: AsyncEngine
) -> None:
    from app.main import create_app
    from tests.conftest import ADMIN_KEY, settings_for

    application = create_app(
        settings_for(database_url, capacity_enforce_device_limits=True), run_migrations=False
    )
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers) as admin:
            pool = await make_pool(admin)
            plain = await add_node(admin, pool, gpu_node("operator-node", 2))  # no agent, no capability
            with_cpu = reservation(pool, 1, resources={"cpu": 4})
            pending = (await admin.post("/v1/reservations", json=with_cpu)).json()
            assert pending["status"] == "pending"
            assert "labels: missing bc.dev/cap.devices.limits" in pending["conditions"][0]["message"]
            gpus_only = (await admin.post("/v1/reservations", json=reservation(pool, 1))).json()
            assert gpus_only["allocations"][0]["nodeId"] == plain["id"]  # no host resources: no capability

            agent = (await admin.post("/v1/nodes/hello", json=hello_body(pool, "agent-node"))).json()
            preview = (
                await admin.post("/v1/capacity/preview", json=reservation(pool, 1, resources={"cpu": 4}))
            ).json()
            assert {c["nodeId"] for c in preview["candidates"]} == {agent["nodeId"]}
            placed = (
                await admin.post("/v1/reservations", json=reservation(pool, 1, resources={"cpu": 4}))
            ).json()
            assert placed["status"] == "placed" and placed["allocations"][0]["nodeId"] == agent["nodeId"]


async def test_hello_to_an_archived_pool_is_409(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    assert (await admin_client.post("/v1/nodes/hello", json=hello_body(pool))).status_code == 200
    await admin_client.post(f"/v1/pools/{pool}/archive")
    for name, host in (("h200-a", 0), ("new", 3)):
        r = await admin_client.post("/v1/nodes/hello", json=hello_body(pool, name, host=host, gpus=1))
        assert r.status_code == 409 and r.json()["error"]["code"] == "POOL_ARCHIVED", r.text
    assert (await admin_client.get(f"/v1/pools/{pool}")).json()["nodeCount"] == 1


async def test_a_device_registered_on_another_node_is_409_and_changes_nothing(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    await admin_client.post("/v1/nodes/hello", json=hello_body(pool, "a"))
    b = (await admin_client.post("/v1/nodes/hello", json=hello_body(pool, "b", gpus=1, host=5))).json()
    v = await version(engine, pool)
    for body in (hello_body(pool, "c"), hello_body(pool, "b")):  # create, then update, with a's GPUs
        r = await admin_client.post("/v1/nodes/hello", json=body)
        assert r.status_code == 409 and r.json()["error"]["details"]["deviceId"] == FIRST_UUID
    assert await version(engine, pool) == v
    node = (await admin_client.get(f"/v1/nodes/{b['nodeId']}")).json()
    assert [d["id"] for d in node["devices"]] == [FIRST_UUID.replace("00000000", "00000005")]
