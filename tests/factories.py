"""The one home of test factories (issue 16): node bodies for the API (``gpu_node``) and the services
(``node_body``), pipeline snapshots for the pure placement tests (``gpu_snapshot``), and helpers that
build inventory through the real API (no direct table writes)."""

from __future__ import annotations

import itertools
from decimal import Decimal
from typing import Any

import httpx

from app.inventory.schemas import NodeCreate
from app.placement.model import Atom, NodeInventory, NodeSnapshot, NodeState, ScalarResource

_counter = itertools.count()


def gpu_node(
    name: str,
    gpus: int = 8,
    *,
    link: str = "NV12",
    cpu: float | None = 64,
    memory: float | None = 512_000,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    cordoned: bool = False,
    attributes: dict[str, Any] | None = None,
    numa_split: bool = True,
) -> dict[str, Any]:
    """A node body with ``gpus`` atoms ``<name>-GPU<i>``, all pairs joined by ``link``."""
    ids = [f"{name}-GPU{i}" for i in range(gpus)]
    devices = [
        {
            "id": atom,
            "class": "gpu",
            "attributes": dict(attributes or {"gpuProduct": "H100-SXM5-80GB", "vramGiB": 80}),
            "numaNode": (i * 2 // gpus) if numa_split else 0,
        }
        for i, atom in enumerate(ids)
    ]
    links = [{"a": a, "b": b, "link": link} for a, b in itertools.combinations(ids, 2)]
    resources: dict[str, Any] = {}
    if cpu is not None:
        resources["cpu"] = {"allocatable": cpu}
    if memory is not None:
        resources["memory"] = {"allocatable": memory}
    return {
        "name": name,
        "devices": devices,
        "links": links,
        "resources": resources,
        "labels": labels or {},
        "taints": taints or [],
        "cordoned": cordoned,
    }


def node_body(name: str, gpus: int = 8, link: str = "NV12", cpu: int | None = 64, **extra: Any) -> NodeCreate:
    """:func:`gpu_node` as the inventory service takes it: GPUs with ``vramGiB`` 80 only, no memory row;
    ``extra`` fields (labels, taints, ...) replace the body's."""
    body = gpu_node(name, gpus, link=link, cpu=cpu, memory=None, attributes={"vramGiB": 80})
    body.update(extra)
    return NodeCreate.model_validate(body)


def gpu_snapshot(
    node_id: str = "node_a",
    gpus: int = 4,
    attributes: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    label_sources: dict[str, str] | None = None,
    reasons: tuple[str, ...] = (),
    booked: tuple[int, ...] = (),
    unavailable: tuple[int, ...] = (),
    resources: dict[str, tuple[str, str, str]] | None = None,
    link: str | None = "NV12",
    leasable: bool = True,
) -> NodeSnapshot:
    """A pipeline node (no database): ``gpus`` GPUs ``<node_id>-GPU<i>`` (all pairs ``link``, NUMA 0),
    labels, NoSchedule reasons, booked / unavailable GPU indices and scalar rows ``{name: (allocatable,
    ratio, allocated)}``."""
    atoms = tuple(
        Atom(id=f"{node_id}-GPU{i}", device_class="gpu", attributes=dict(attributes or {}), numa_node=0)
        for i in range(gpus)
    )
    links = {}
    if link is not None:
        links = {(atoms[a].id, atoms[b].id): link for a in range(gpus) for b in range(a + 1, gpus)}
    rows = {
        name: ScalarResource(Decimal(a), Decimal(r), Decimal(u))
        for name, (a, r, u) in (resources or {}).items()
    }
    return NodeSnapshot(
        NodeInventory(
            id=node_id,
            name=node_id,
            labels=dict(labels or {}),
            label_sources=dict(label_sources or {}),
            atoms=atoms,
            links=links,
        ),
        NodeState(
            no_schedule_reasons=reasons,
            leasable=leasable,
            booked=frozenset(f"{node_id}-GPU{i}" for i in booked),
            unavailable=frozenset(f"{node_id}-GPU{i}" for i in unavailable),
            resources=rows,
        ),
    )


async def make_pool(client: httpx.AsyncClient, name: str | None = None) -> str:
    """Create a pool and return its id."""
    r = await client.post("/v1/pools", json={"name": name or f"pool-{next(_counter)}"})
    assert r.status_code == 201, r.text
    return r.json()["id"]


async def add_node(client: httpx.AsyncClient, pool_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """Register a node and return its view."""
    r = await client.post(f"/v1/pools/{pool_id}/nodes", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def reservation(
    pool_id: str, gpus: int = 1, key: str | None = None, tenant: str = "acme", **extra: Any
) -> dict:
    """A reservation body for ``gpus`` GPUs for one day."""
    body: dict[str, Any] = {
        "tenantId": tenant,
        "poolId": pool_id,
        "devices": [{"class": "gpu", "count": gpus}] if gpus else [],
        "duration": "1d",
        "idempotencyKey": key or f"key-{next(_counter)}",
    }
    body.update(extra)
    return body


async def wait_for_status(
    client: httpx.AsyncClient, reservation_id: str, status: str, within: float = 10.0
) -> dict[str, Any]:
    """Poll the reservation until it has ``status`` (every 20 ms); its view, or AssertionError after
    ``within`` seconds with the last view."""
    import asyncio
    import time

    deadline = time.monotonic() + within
    while True:
        view = (await client.get(f"/v1/reservations/{reservation_id}")).json()
        if view.get("status") == status or time.monotonic() > deadline:
            assert view.get("status") == status, view
            return view
        await asyncio.sleep(0.02)
