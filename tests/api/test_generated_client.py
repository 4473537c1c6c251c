"""A client generated from the checked-in OpenAPI document with openapi-python-client drives the real
app: its answers arrive as typed models, not bags of ``additional_properties`` (issue 10, "Done when" 2).

The client is generated once per session into a temporary folder and imported from there; it talks to
the in-process app (with its real PostgreSQL) through an httpx ASGI transport.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN_KEY
from tests.factories import add_node, gpu_node, make_pool

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "bc_generated_client"


@pytest.fixture(scope="session")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The generated package (imported) and the generator's output."""
    folder = tmp_path_factory.mktemp("generated")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "openapi_python_client",
            "generate",
            "--path",
            str(ROOT / "openapi" / "openapi.json"),
            "--meta",
            "none",
            "--output-path",
            str(folder / PACKAGE),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=folder,
    )
    sys.path.insert(0, str(folder))
    try:
        package = importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(folder))
    return {"package": package, "result": result}


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"{PACKAGE}.{name}")


def test_generating_the_client_warns_about_nothing(generated: dict[str, Any]) -> None:
    result = generated["result"]
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for word in ("WARNING", "Unable", "Cannot", "duplicate", "Error"):
        assert word not in output, output


@pytest.fixture
async def client(app: Any, generated: dict[str, Any]) -> AsyncIterator[Any]:
    """The generated AuthenticatedClient on the in-process app, with the admin key."""
    client = generated["package"].AuthenticatedClient(base_url="http://test", token=ADMIN_KEY)
    transport = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://test",
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=60,
    )
    client.set_async_httpx_client(transport)
    async with transport:
        yield client


async def test_the_generated_client_previews_reserves_retries_lists_and_releases(
    client: Any, admin_client: httpx.AsyncClient
) -> None:
    models = _module("models")
    preview_capacity = _module("api.reservations.preview_capacity")
    create_reservation = _module("api.reservations.create_reservation")
    get_reservation = _module("api.reservations.get_reservation")
    list_reservations = _module("api.reservations.list_reservations")
    release_reservation = _module("api.reservations.release_reservation")
    pool = await make_pool(admin_client)
    node = await add_node(admin_client, pool, gpu_node("gen-a", 4))

    def body(count: int, key: str = "gen-1") -> Any:
        return models.ReservationRequest(
            tenant_id="acme",
            pool_id=pool,
            duration="1h",
            idempotency_key=key,
            devices=[models.DeviceRequestBody(class_="gpu", count=count)],
        )

    preview = await preview_capacity.asyncio_detailed(client=client, body=body(2))
    assert preview.status_code == 200
    assert isinstance(preview.parsed, models.Preview) and preview.parsed.fits is True
    best = preview.parsed.candidates[0]
    assert isinstance(best, models.Candidate) and best.node_id == node["id"] and len(best.atoms) == 2
    assert isinstance(preview.parsed.candidates[0].score, float) and 0 < best.score

    created = await create_reservation.asyncio_detailed(client=client, body=body(2))
    assert created.status_code == 201
    reservation = created.parsed
    assert isinstance(reservation, models.Reservation)
    assert reservation.status == models.ReservationStatus.PLACED
    assert isinstance(reservation.allocations[0], models.Allocation)
    assert reservation.allocations[0].node_id == node["id"] and len(reservation.allocations[0].atoms) == 2
    assert reservation.spec.devices[0].class_ == "gpu" and reservation.spec.devices[0].count == 2
    assert isinstance(reservation.created_at, datetime) and reservation.created_at.utcoffset() is not None
    assert reservation.allocations[0].start < reservation.allocations[0].end  # parsed times

    retried = await create_reservation.asyncio_detailed(client=client, body=body(2))
    assert retried.status_code == 200  # declared beside the 201: parsed, not None
    assert isinstance(retried.parsed, models.Reservation) and retried.parsed.id == reservation.id

    read = await get_reservation.asyncio_detailed(reservation.id, client=client)
    assert isinstance(read.parsed, models.Reservation)
    assert read.parsed.allocations[0].atoms == reservation.allocations[0].atoms

    listed = await list_reservations.asyncio_detailed(client=client, tenant_id="acme", limit=10)
    assert isinstance(listed.parsed, models.ReservationList)
    assert [r.id for r in listed.parsed.items] == [reservation.id] and listed.parsed.next_cursor is None

    released = await release_reservation.asyncio_detailed(reservation.id, client=client)
    assert isinstance(released.parsed, models.Reservation)
    assert released.parsed.status == models.ReservationStatus.RELEASED

    refused = await create_reservation.asyncio_detailed(client=client, body=body(0, key="gen-2"))
    assert refused.status_code == 422
    error = refused.parsed
    assert isinstance(error, models.ErrorBody) and error.error.code == "INVALID_INPUT"
    assert error.error.details["path"] == "devices.0.count"
    everything = (await admin_client.get("/v1/reservations")).json()["items"]
    assert [r["id"] for r in everything] == [reservation.id]  # the refused request wrote nothing


async def test_the_generated_client_reads_nodes_and_explanations_typed(
    client: Any, admin_client: httpx.AsyncClient
) -> None:
    models = _module("models")
    get_node = _module("api.inventory.get_node")
    list_nodes = _module("api.inventory.list_nodes")
    explain_placement = _module("api.placement.explain_placement")
    pool = await make_pool(admin_client)
    made = await add_node(admin_client, pool, gpu_node("gen-b", 2))

    node = (await get_node.asyncio_detailed(made["id"], client=client)).parsed
    assert isinstance(node, models.Node) and isinstance(node.devices[0], models.Device)
    assert node.devices[0].class_ == "gpu" and isinstance(node.links[0], models.Link)
    assert node.links[0].link == "NV12" and node.resources["cpu"].allocatable == 64
    page = (await list_nodes.asyncio_detailed(pool, client=client, limit=1)).parsed
    assert isinstance(page, models.NodeList) and page.items[0].id == made["id"] and page.next_cursor is None

    data = ROOT / "tests" / "data" / "explain"
    body = models.ExplainBody.from_dict(
        {
            "fleet": json.loads((data / "seed-fleet.json").read_text()),
            "request": json.loads((data / "seed-request.json").read_text()),
            "now": "2026-10-12T12:00:00+00:00",
        }
    )
    explanation = (await explain_placement.asyncio_detailed(client=client, body=body)).parsed
    assert isinstance(explanation, models.Explanation)
    expected = json.loads((data / "seed-explain.json").read_text())
    assert [c.target for c in explanation.candidates] == [c["target"] for c in expected["candidates"]]
    assert (
        explanation.candidates[0].completion.complete is expected["candidates"][0]["completion"]["complete"]
    )
    assert explanation.to_dict() == expected  # typed, and nothing lost on the way
