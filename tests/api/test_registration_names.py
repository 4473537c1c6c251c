"""Names on every registration path (docs/selectors.md): the ``bc.dev/`` namespace is refused in device
attributes as in labels (422 with the field path, nothing written), and every attribute the selectors
document, ``numaNode`` included, is selectable however the node was registered: by an operator
(``POST /v1/pools/{id}/nodes``), by import (``.../nodes/import``) or by its agent (``/v1/nodes/hello``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.tables import devices, nodes, pools
from app.errors import InvalidInput
from app.inventory.importer import ImportedDevice, build_imported_node
from app.inventory.node_rows import device_bodies
from app.placement.system_labels import is_system_key
from tests.agent_host import h200_host
from tests.api.test_agents import hello_body
from tests.conftest import DATA
from tests.factories import add_node, gpu_node, make_pool, reservation

SPOOF = "bc.dev/driver.nvidia"
EXAMPLES = DATA.parent.parent / "app" / "inventory" / "examples"


def _examples() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(EXAMPLES.glob("*.topo.txt"))}


async def _pool_state(engine: AsyncEngine, pool: str) -> tuple[int, int, int]:
    """(nodes, devices, inventory version) of the pool: what a refused registration must not change."""
    async with engine.connect() as conn:
        count = (await conn.execute(sa.select(sa.func.count()).where(nodes.c.pool_id == pool))).scalar_one()
        atoms = (
            await conn.execute(
                sa.select(sa.func.count())
                .select_from(devices.join(nodes, nodes.c.id == devices.c.node_id))
                .where(nodes.c.pool_id == pool)
            )
        ).scalar_one()
        version = (
            await conn.execute(sa.select(pools.c.inventory_version).where(pools.c.id == pool))
        ).scalar_one()
    return count, atoms, version


# ------------------------------------------------------------------------------ bc.dev/ is reserved


async def test_an_operator_node_with_a_bc_dev_attribute_is_refused_and_nothing_is_written(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool = await make_pool(admin_client)
    await add_node(admin_client, pool, gpu_node("kept", 2))
    before = await _pool_state(engine, pool)
    body = gpu_node("spoofer", 2)
    body["devices"][1]["attributes"][SPOOF] = "580.159.04"
    r = await admin_client.post(f"/v1/pools/{pool}/nodes", json=body)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "INVALID_INPUT"
    assert error["details"]["path"] == f"devices.1.attributes.{SPOOF}"
    assert SPOOF in error["message"] and "reserved" in error["message"]
    assert await _pool_state(engine, pool) == before


@pytest.mark.parametrize("route", ["import", "hello"])
async def test_import_and_hello_take_no_device_attributes_from_the_caller(
    admin_client: httpx.AsyncClient, engine: AsyncEngine, route: str
) -> None:
    """Import and Hello derive every attribute from nvidia-smi: a caller's ``devices`` is refused (422,
    nothing written), and so is a ``bc.dev/`` label beside it."""
    pool = await make_pool(admin_client)
    before = await _pool_state(engine, pool)
    topo, xml = h200_host(1)
    spoofed = [{"id": "GPU-x", "attributes": {SPOOF: "1"}}]
    if route == "import":
        url, body = f"/v1/pools/{pool}/nodes/import", {"name": "n", "topo": topo, "nvidiaSmiXml": xml}
    else:
        url, body = "/v1/nodes/hello", hello_body(pool, gpus=1)
    r = await admin_client.post(url, json={**body, "devices": spoofed})
    assert r.status_code == 422 and r.json()["error"]["details"]["path"] == "devices", r.text
    r = await admin_client.post(url, json={**body, "labels": {SPOOF: "1"}})
    assert r.status_code == 422 and r.json()["error"]["details"]["path"] == f"labels.{SPOOF}", r.text
    assert await _pool_state(engine, pool) == before


def test_a_derived_bc_dev_attribute_is_refused_on_the_import_and_hello_path() -> None:
    """The one conversion import and Hello (create and update) store devices through refuses a
    ``bc.dev/`` attribute, whatever derived it."""
    real = build_imported_node("n", _examples()["h200.topo.txt"], None)
    imported = replace(
        real,
        devices=[
            ImportedDevice(id="GPU-a", attributes={"gpuModel": "H200"}),
            ImportedDevice(id="GPU-b", attributes={SPOOF: "1"}),
        ],
    )
    with pytest.raises(InvalidInput) as refused:
        device_bodies(imported)
    assert refused.value.details["path"] == f"nvidiaSmiXml.1.attributes.{SPOOF}"


@pytest.mark.parametrize("name", sorted(_examples()))
def test_the_importer_derives_no_reserved_attribute(name: str) -> None:
    topo = _examples()[name]
    xml = (EXAMPLES / "h200.nvidia-smi-q.xml").read_text() if name.startswith("h200") else None
    imported = build_imported_node("n", topo, xml)
    assert imported.devices
    assert not [k for d in imported.devices for k in d.attributes if is_system_key(k)]


async def test_a_stored_bc_dev_attribute_is_not_read_by_a_selector(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """A row written before the rule (stored directly): a selector on the key reads past it to the
    node label, which only Hello writes."""
    pool = await make_pool(admin_client)
    node = await add_node(admin_client, pool, gpu_node("legacy", 2))
    async with engine.begin() as conn:
        await conn.execute(
            sa.update(devices)
            .where(devices.c.node_id == node["id"])
            .values(attributes=devices.c.attributes.op("||")(sa.func.jsonb_build_object(SPOOF, "580")))
        )
        await conn.execute(sa.update(pools).values(inventory_version=pools.c.inventory_version + 1))
    preview = await admin_client.post(
        "/v1/capacity/preview",
        json=reservation(pool, 1, devices=[{"class": "gpu", "count": 1, "selector": SPOOF}]),
    )
    assert preview.status_code == 200, preview.text
    assert preview.json()["fits"] is False and "selector: 0 of 2 gpu match" in preview.json()["reason"]


# ---------------------------------------------------------------- numaNode on every registration path


async def _register(client: httpx.AsyncClient, pool: str, route: str) -> dict[str, Any]:
    """An 8-GPU node with GPUs 0-3 on NUMA node 0 and 4-7 on NUMA node 1, registered by ``route``."""
    topo = _examples()["dgx-h100.topo.txt"]
    if route == "operator":
        return await add_node(client, pool, gpu_node("numa", 8))
    if route == "import":
        r = await client.post(f"/v1/pools/{pool}/nodes/import", json={"name": "numa", "topo": topo})
        assert r.status_code == 201, r.text
        return r.json()
    r = await client.post("/v1/nodes/hello", json={"poolId": pool, "name": "numa", "topo": topo})
    assert r.status_code == 200, r.text
    return (await client.get(f"/v1/nodes/{r.json()['nodeId']}")).json()


def _numa(count: int, selector: str) -> dict[str, Any]:
    return {"class": "gpu", "count": count, "selector": selector}


@pytest.mark.parametrize("route", ["operator", "import", "hello"])
async def test_a_numa_node_selector_matches_however_the_node_was_registered(
    admin_client: httpx.AsyncClient, route: str
) -> None:
    pool = await make_pool(admin_client)
    node = await _register(admin_client, pool, route)
    second = [d["id"] for d in node["devices"] if d["numaNode"] == 1]
    assert len(second) == 4
    assert all(d["attributes"]["numaNode"] == d["numaNode"] for d in node["devices"])
    preview = (
        await admin_client.post(
            "/v1/capacity/preview", json=reservation(pool, devices=[_numa(4, "numaNode = 1")])
        )
    ).json()
    assert preview["fits"] is True and sorted(preview["candidates"][0]["atoms"]) == sorted(second)
    too_many = (
        await admin_client.post(
            "/v1/capacity/preview", json=reservation(pool, devices=[_numa(5, "numaNode >= 1")])
        )
    ).json()
    # five atoms on NUMA node 1 or above exist on no node: refused at intake, naming the largest shape
    assert too_many["fits"] is False and too_many["satisfiable"] is False
    assert "the largest has 4" in too_many["unsatisfiableReason"]
    placed = await admin_client.post(
        "/v1/reservations", json=reservation(pool, devices=[_numa(2, "numaNode = 1")])
    )
    assert placed.status_code == 201 and placed.json()["status"] == "placed", placed.text
    assert set(placed.json()["allocations"][0]["atoms"]) <= set(second)


async def test_a_node_stored_without_the_numa_attribute_is_still_selectable(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """A device row written before the rule (numa_node set, no ``numaNode`` attribute) is matched by
    its NUMA node: the rule is read, not only written."""
    pool = await make_pool(admin_client)
    node = await add_node(admin_client, pool, gpu_node("old", 4))
    async with engine.begin() as conn:
        await conn.execute(
            sa.update(devices)
            .where(devices.c.node_id == node["id"])
            .values(attributes=devices.c.attributes.op("-")("numaNode"))
        )
        await conn.execute(sa.update(pools).values(inventory_version=pools.c.inventory_version + 1))
    preview = (
        await admin_client.post(
            "/v1/capacity/preview", json=reservation(pool, devices=[_numa(2, "numaNode = 1")])
        )
    ).json()
    assert preview["fits"] is True
    assert sorted(preview["candidates"][0]["atoms"]) == ["old-GPU2", "old-GPU3"]


@pytest.mark.parametrize(
    ("device", "path", "message"),
    [
        ({"numaNode": 1, "attributes": {"numaNode": 0}}, "devices.0.numaNode", "disagrees"),
        ({"attributes": {"numaNode": "one"}}, "devices.0.attributes", "integer"),
        ({"attributes": {"numaNode": True}}, "devices.0.attributes", "integer"),
    ],
)
async def test_a_numa_node_and_its_attribute_are_one_fact(
    admin_client: httpx.AsyncClient, engine: AsyncEngine, device: dict[str, Any], path: str, message: str
) -> None:
    pool = await make_pool(admin_client)
    before = await _pool_state(engine, pool)
    body = {"name": "n", "devices": [{"id": "GPU-0", "class": "gpu", **device}]}
    r = await admin_client.post(f"/v1/pools/{pool}/nodes", json=body)
    assert r.status_code == 422 and r.json()["error"]["details"]["path"] == path, r.text
    assert message in r.json()["error"]["message"]
    assert await _pool_state(engine, pool) == before
    # the attribute alone is the NUMA node too: the picker and the selectors see the same one
    ok = await admin_client.post(
        f"/v1/pools/{pool}/nodes",
        json={"name": "m", "devices": [{"id": "GPU-1", "attributes": {"numaNode": 3}}]},
    )
    assert ok.status_code == 201, ok.text
    assert ok.json()["devices"][0]["numaNode"] == 3
