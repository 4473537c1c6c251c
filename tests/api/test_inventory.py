"""Inventory through the API: node import from real nvidia-smi output, cordon, taints and dedication,
labels, health; bad input is 422 and writes nothing (issue 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from tests.factories import add_node, gpu_node, make_pool, reservation

DATA = Path(__file__).resolve().parent.parent / "data"


async def _table_counts(engine: Any) -> dict[str, int]:
    async with engine.connect() as conn:
        return {
            t: (await conn.exec_driver_sql(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("nodes", "devices", "capacity_device_links", "node_labels", "node_resources")
        }


async def test_import_dgx1_topology_makes_atoms_and_links(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    topo = (DATA / "topo" / "01-dgx1-v100-hybrid-cube-mesh-mlx5.txt").read_text()
    expected = json.loads((DATA / "topo" / "01-dgx1-v100-hybrid-cube-mesh-mlx5.expected.json").read_text())
    r = await admin_client.post(
        f"/v1/pools/{pool}/nodes/import",
        json={"name": "dgx1", "topo": topo, "resources": {"cpu": {"allocatable": 80}}},
    )
    assert r.status_code == 201, r.text
    node = r.json()
    assert [d["id"] for d in node["devices"]] == [f"dgx1-GPU{i}" for i in range(8)]
    links = {(link["a"], link["b"]): link["link"] for link in node["links"]}
    assert len(links) == 28  # every GPU pair; NIC rows and columns are not atoms
    for pair, kind in expected["gpu_links"].items():
        a, b = (f"dgx1-{g}" for g in pair.split("-"))
        assert links[tuple(sorted((a, b)))] == kind
    assert node["labels"]["gpu.count"] == "8" and node["labelSources"]["gpu.count"] == "system"

    # a 4-GPU nvlink-all request gets an NV-complete quad; 8 cannot be NVLink-complete on a DGX-1
    four = await admin_client.post(
        "/v1/capacity/preview",
        json=reservation(pool, 0, devices=[{"class": "gpu", "count": 4, "topology": "nvlink-all"}]),
    )
    atoms = four.json()["candidates"][0]["atoms"]
    for i, a in enumerate(atoms):
        for b in atoms[i + 1 :]:
            assert links[tuple(sorted((a, b)))].startswith("NV")
    eight = await admin_client.post(
        "/v1/capacity/preview",
        json=reservation(pool, 0, devices=[{"class": "gpu", "count": 8, "topology": "nvlink-all"}]),
    )
    # the DGX-1 hybrid cube mesh has NVLink-complete sets of 4 at most: never 8 (checked at intake)
    assert eight.json()["satisfiable"] is False and eight.json()["fits"] is False
    assert eight.json()["unsatisfiableReason"].endswith(" can hold 8 gpu NVLink-complete: the largest has 4")


async def test_import_with_nvidia_smi_xml_takes_uuids_and_attributes(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    r = await admin_client.post(
        f"/v1/pools/{pool}/nodes/import",
        json={
            "name": "h200",
            "topo": (DATA / "h200-host" / "topo-m.txt").read_text(),
            "nvidiaSmiXml": (DATA / "h200-host" / "nvidia-smi-q.xml").read_text(),
        },
    )
    assert r.status_code == 201, r.text
    [gpu] = r.json()["devices"]
    assert gpu["id"] == "GPU-00000000-1111-2222-3333-444444444444"
    assert gpu["attributes"]["gpuProduct"] == "H200"
    assert gpu["attributes"]["vramGiB"] == 140
    assert gpu["attributes"]["computeCapability"] == "9.0"
    assert gpu["numaNode"] == 0
    selected = await admin_client.post(
        "/v1/capacity/preview",
        json=reservation(
            pool,
            0,
            devices=[{"class": "gpu", "count": 1, "selector": "gpuProduct in (H200), vramGiB >= 141"}],
        ),
    )
    # device attributes are static: no GPU of this pool can ever match (checked at intake)
    assert selected.json()["satisfiable"] is False
    assert selected.json()["unsatisfiableReason"].endswith(
        " can hold 1 gpu matching the selector: the largest has 0"
    )


async def test_bad_inventory_input_is_422_and_writes_nothing(
    admin_client: httpx.AsyncClient, engine: Any
) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("ok"))
    before = await _table_counts(engine)
    bad = [
        (f"/v1/pools/{pool}/nodes/import", {"name": "x", "topo": "this is not a matrix"}, "topo"),
        (
            f"/v1/pools/{pool}/nodes/import",
            {
                "name": "x",
                "topo": (DATA / "h200-host" / "topo-m.txt").read_text(),
                "nvidiaSmiXml": "<nvidia_smi_log><gpu>",
            },
            "nvidiaSmiXml",
        ),
        (
            f"/v1/pools/{pool}/nodes",
            {**gpu_node("y"), "resources": {"cpu": {"allocatable": -1}}},
            "resources.cpu.allocatable",
        ),
        (
            f"/v1/pools/{pool}/nodes",
            {**gpu_node("z"), "links": [{"a": "z-GPU0", "b": "nope", "link": "NV1"}]},
            "",
        ),
        (
            f"/v1/pools/{pool}/nodes",
            {**gpu_node("w"), "taints": [{"key": "dedicated", "value": "a", "effect": "Maybe"}]},
            "taints.0.effect",
        ),
    ]
    for path, body, field in bad:
        r = await admin_client.post(path, json=body)
        assert r.status_code == 422, (path, r.text)
        assert r.json()["error"]["code"] == "INVALID_INPUT"
        assert r.json()["error"]["details"]["path"].startswith(field)
    dup = await admin_client.post(f"/v1/pools/{pool}/nodes", json=gpu_node("ok"))
    assert dup.status_code == 409
    assert await _table_counts(engine) == before


async def test_cordon_taint_dedication_and_health_steer_placement(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    node = await add_node(admin_client, pool, gpu_node("only", 2))
    nid = node["id"]

    def preview(tenant: str) -> Any:
        return admin_client.post("/v1/capacity/preview", json=reservation(pool, 1, tenant=tenant))

    view = (await admin_client.post(f"/v1/nodes/{nid}/cordon")).json()
    assert view["cordoned"] and view["noScheduleReasons"] == ["cordoned"]
    assert (await preview("acme")).json()["reason"] == "no node fits (1 node): 1 × cordoned"
    await admin_client.post(f"/v1/nodes/{nid}/uncordon")

    t = await admin_client.put(
        f"/v1/nodes/{nid}/taints", json={"taints": [{"key": "dedicated", "value": "acme"}]}
    )
    assert t.json()["noScheduleReasons"] == ["tainted dedicated=acme"]
    assert (await preview("acme")).json()["fits"] is True
    assert (await preview("globex")).json()["reason"] == "no node fits (1 node): 1 × tainted dedicated=acme"
    await admin_client.put(f"/v1/nodes/{nid}/taints", json={"taints": []})

    h = await admin_client.post(f"/v1/nodes/{nid}/health", json={"ready": False, "heartbeatLost": True})
    assert h.json()["noScheduleReasons"] == ["not ready", "heartbeat lost"]
    assert (await preview("acme")).json()["reason"] == "no node fits (1 node): 1 × not ready, heartbeat lost"
    await admin_client.post(
        f"/v1/nodes/{nid}/health",
        json={"ready": True, "heartbeatLost": False, "devices": [{"id": "only-GPU0", "healthy": False}]},
    )
    two = await admin_client.post("/v1/capacity/preview", json=reservation(pool, 2))
    assert two.json()["reason"] == "no node fits (1 node): 1 × fits: 1 of 2 gpu free"
    unknown = await admin_client.post(
        f"/v1/nodes/{nid}/health", json={"devices": [{"id": "ghost", "healthy": False}]}
    )
    assert unknown.status_code == 422 and unknown.json()["error"]["details"]["path"] == "devices.0.id"

    labels = await admin_client.put(f"/v1/nodes/{nid}/labels", json={"labels": {"rack": "r7"}})
    assert labels.json()["labels"]["rack"] == "r7"


async def test_archived_pool_places_nothing(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("a"))
    archived = await admin_client.post(f"/v1/pools/{pool}/archive")
    assert archived.json()["archivedAt"] is not None
    r = (await admin_client.post("/v1/reservations", json=reservation(pool, 1))).json()
    assert r["status"] == "pending" and r["conditions"][0]["message"] == "the pool is archived"
    refused = await admin_client.post(f"/v1/pools/{pool}/nodes", json=gpu_node("b"))
    assert refused.status_code == 409
    # the one refusal of an archived pool, as an agent's Hello answers it (inventory.refuse_archived)
    assert refused.json()["error"]["code"] == "POOL_ARCHIVED"
    assert refused.json()["error"]["details"] == {"poolId": pool}
    preview = (await admin_client.post("/v1/capacity/preview", json=reservation(pool, 1))).json()
    assert preview == {"fits": False, "candidates": [], "reason": "the pool is archived"}


async def test_list_a_pools_nodes_a_page_at_a_time(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    made = [
        await add_node(admin_client, pool, gpu_node(f"l{i}", 2, labels={"rack": f"r{i}"})) for i in range(3)
    ]
    first = (await admin_client.get(f"/v1/pools/{pool}/nodes", params={"limit": 2})).json()
    assert [n["id"] for n in first["items"]] == sorted(n["id"] for n in made)[:2]
    assert first["items"][0]["devices"] == {"gpu": 2} and first["nextCursor"]
    rest = (await admin_client.get(f"/v1/pools/{pool}/nodes", params={"cursor": first["nextCursor"]})).json()
    assert [n["id"] for n in rest["items"]] == sorted(n["id"] for n in made)[2:] and rest[
        "nextCursor"
    ] is None
    assert (await admin_client.get("/v1/pools/pool_nope/nodes")).status_code == 404


async def test_a_device_registered_elsewhere_is_409_naming_its_node(admin_client: httpx.AsyncClient) -> None:
    """Two hosts reporting one GPU UUID (a cloned VM, an agent pointed at the wrong pool): the 409 says
    which node holds it, so an operator can find it (found by a fresh-user run of the agent)."""
    first_pool, second_pool = await make_pool(admin_client, "first"), await make_pool(admin_client, "second")
    holder = await add_node(admin_client, first_pool, gpu_node("holder", 1))
    again = {**gpu_node("clone", 1), "devices": gpu_node("holder", 1)["devices"]}
    r = await admin_client.post(f"/v1/pools/{second_pool}/nodes", json=again)
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert f"registered on node holder ({holder['id']}) of pool {first_pool}" in error["message"]
    assert error["details"]["nodeId"] == holder["id"] and error["details"]["poolId"] == first_pool


async def test_put_labels_refuses_a_key_the_node_has_as_a_system_label(
    admin_client: httpx.AsyncClient, clean_db: Any
) -> None:
    """``gpu.count`` came from the import (source system): PUT labels naming it is 422 at
    ``labels.gpu.count`` and changes nothing (it was silently dropped before)."""
    pool = await make_pool(admin_client)
    topo = (DATA / "topo" / "01-dgx1-v100-hybrid-cube-mesh-mlx5.txt").read_text()
    node = (
        await admin_client.post(f"/v1/pools/{pool}/nodes/import", json={"name": "n", "topo": topo})
    ).json()
    assert node["labelSources"]["gpu.count"] == "system"
    first = await admin_client.put(f"/v1/nodes/{node['id']}/labels", json={"labels": {"team": "a"}})
    assert first.status_code == 200, first.text
    before = (
        first.json(),
        await _table_counts(clean_db),
        (await admin_client.get(f"/v1/pools/{pool}")).json(),
    )

    r = await admin_client.put(
        f"/v1/nodes/{node['id']}/labels", json={"labels": {"team": "b", "gpu.count": "16"}}
    )
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == "labels.gpu.count"
    assert "system label" in error["message"]
    after = (
        (await admin_client.get(f"/v1/nodes/{node['id']}")).json(),
        await _table_counts(clean_db),
        (await admin_client.get(f"/v1/pools/{pool}")).json(),
    )
    assert after == before
