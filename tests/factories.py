"""Factories that build inventory through the real API (no direct table writes)."""

from __future__ import annotations

import itertools
from typing import Any

import httpx

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
