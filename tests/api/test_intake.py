"""Requests checked against the pool at intake (issue 22; docs/api.md, "Checked at intake"), through the
real app on real PostgreSQL: on the inline create, the pool-lease create, bulk items and preview, an
unknown device class or resource is 422 INVALID_INPUT at its field, a request no node could ever hold is
422 UNSATISFIABLE (preview: ``satisfiable: false``), an unknown selector key is a warning, and nothing
is written for a refused request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import ADMIN_KEY, settings_for
from tests.factories import add_node, gpu_node, make_pool, reservation

COUNTED = (
    "reservations",
    "allocations",
    "device_bookings",
    "scalar_holdings",
    "quota_holdings",
    "quota_usage",
)
TYPO = {"matchExpressions": [{"key": "gpu.modle", "op": "In", "values": ["H100"]}]}
TYPO_WARNING = (
    "selector key gpu.modle (devices.0) is carried by no device attribute or node label of pool gpu-hosts"
)


async def _counts(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        return {t: (await conn.exec_driver_sql(f"SELECT count(*) FROM {t}")).scalar_one() for t in COUNTED}


async def _pool(client: httpx.AsyncClient) -> str:
    """Two 8-GPU hosts (64 cpu each) in rack r1 and one 4-GPU host in rack r2, with a quota row."""
    pool = await make_pool(client, "gpu-hosts")
    await add_node(client, pool, gpu_node("a", 8, labels={"rack": "r1"}))
    await add_node(client, pool, gpu_node("b", 8, labels={"rack": "r1"}))
    await add_node(client, pool, gpu_node("c", 4, labels={"rack": "r2"}))
    r = await client.put(f"/v1/tenants/acme/quotas/{pool}", json={"limits": {"gpu": 64}})
    assert r.status_code == 200, r.text
    return pool


def _refusals(pool: str) -> list[tuple[dict[str, Any], str, str, str | None]]:
    """(body, code, message, details.path) of each refused request."""
    return [
        (
            reservation(pool, 0, devices=[{"class": "tpu", "count": 1}]),
            "INVALID_INPUT",
            "pool gpu-hosts has no device class tpu; it has: gpu",
            "devices.0.class",
        ),
        (
            reservation(pool, 1, resources={"cpus": 4}),
            "INVALID_INPUT",
            "pool gpu-hosts has no resource cpus; it has: cpu, memory",
            "resources.cpus",
        ),
        (
            reservation(pool, 100),
            "UNSATISFIABLE",
            "no node of pool gpu-hosts can hold 100 gpu: the largest has 8",
            None,
        ),
        (
            reservation(pool, 1, resources={"cpu": 65}),
            "UNSATISFIABLE",
            "no node of pool gpu-hosts can hold 65 cpu: the largest has 64",
            None,
        ),
        (
            reservation(pool, 5, gang={"members": 3, "topologyKey": "rack"}),
            "UNSATISFIABLE",
            "no rack of pool gpu-hosts has 3 nodes that can hold a member each: the largest has 2",
            None,
        ),
    ]


def _check_refusal(
    answer: httpx.Response | dict[str, Any], code: str, message: str, path: str | None
) -> None:
    error = answer.json()["error"] if isinstance(answer, httpx.Response) else answer["error"]
    assert (error["code"], error["message"]) == (code, message), error
    assert error["details"].get("path") == path


async def test_inline_create_refuses_what_the_pool_can_never_hold_and_writes_nothing(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    pool = await _pool(admin_client)
    # 8 GPUs take one of the two 8-GPU hosts whichever the pick chooses, so a 2-node gang of 8 cannot fit now
    placed = await admin_client.post("/v1/reservations", json=reservation(pool, 8))
    assert placed.status_code == 201 and placed.json()["status"] == "placed"
    before = await _counts(clean_db)
    for body, code, message, path in _refusals(pool):
        r = await admin_client.post("/v1/reservations", json=body)
        assert r.status_code == 422, r.text
        _check_refusal(r, code, message, path)
    assert await _counts(clean_db) == before
    # a 2-node gang in one rack fits; a request the pool could hold but cannot now is pending, as before
    fits = await admin_client.post("/v1/reservations", json=reservation(pool, 8, gang={"members": 2}))
    assert fits.status_code == 201 and fits.json()["status"] == "pending", fits.text
    assert "warnings" not in fits.json()


async def test_an_empty_pool_keeps_its_pending_reason(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    r = await admin_client.post(
        "/v1/reservations", json=reservation(pool, 0, devices=[{"class": "tpu", "count": 100}])
    )
    assert r.status_code == 201 and r.json()["status"] == "pending", r.text
    assert r.json()["conditions"][0]["message"] == "the pool has no nodes"


async def test_a_selector_key_nothing_carries_is_a_warning_on_create_and_preview(
    admin_client: httpx.AsyncClient,
) -> None:
    pool = await _pool(admin_client)
    body = reservation(pool, 0, devices=[{"class": "gpu", "count": 1, "selector": TYPO}])
    preview = await admin_client.post("/v1/capacity/preview", json=body)
    assert preview.status_code == 200, preview.text
    assert preview.json()["warnings"] == [TYPO_WARNING]
    created = await admin_client.post("/v1/reservations", json=body)
    assert created.status_code == 201, created.text
    assert created.json()["status"] == "pending"  # no atom matches: it waits, as the seed says
    assert created.json()["warnings"] == [TYPO_WARNING]
    known = reservation(pool, 0, devices=[{"class": "gpu", "count": 1, "selector": "gpuProduct, rack"}])
    assert "warnings" not in (await admin_client.post("/v1/capacity/preview", json=known)).json()


async def test_preview_answers_unsatisfiable_as_a_value(admin_client: httpx.AsyncClient) -> None:
    pool = await _pool(admin_client)
    for body, code, message, path in _refusals(pool):
        r = await admin_client.post("/v1/capacity/preview", json=body)
        if code == "INVALID_INPUT":
            assert r.status_code == 422, r.text
            _check_refusal(r, code, message, path)
        else:
            assert r.status_code == 200, r.text
            answer = r.json()
            assert answer["reason"].startswith("no node fits (") and answer["unsatisfiableReason"] == message
            assert {k: answer[k] for k in ("fits", "satisfiable", "candidates")} == {
                "fits": False,
                "satisfiable": False,
                "candidates": [],
            }
    busy = (await admin_client.post("/v1/capacity/preview", json=reservation(pool, 8))).json()
    assert busy["fits"] is True and "satisfiable" not in busy


async def test_bulk_refuses_the_item_alone(admin_client: httpx.AsyncClient, clean_db: AsyncEngine) -> None:
    pool = await _pool(admin_client)
    before = await _counts(clean_db)
    refusals = _refusals(pool)
    items = [
        reservation(pool, 1, key="ok-1"),
        *(body for body, *_ in refusals),
        reservation(pool, 1, key="ok-2"),
    ]
    items.append(reservation(pool, 0, key="warned", devices=[{"class": "gpu", "count": 1, "selector": TYPO}]))
    r = await admin_client.post("/v1/reservations/batch", json={"items": items})
    assert r.status_code == 200, r.text
    answers = r.json()["items"]
    assert [a["status"] for a in answers] == [201, *(422 for _ in refusals), 201, 201]
    for i, (_, code, message, path) in enumerate(refusals, start=1):
        _check_refusal(answers[i], code, message, path and f"items.{i}.{path}")
    assert answers[0]["reservation"]["status"] == answers[-2]["reservation"]["status"] == "placed"
    assert "warnings" not in answers[0]["reservation"]
    assert answers[-1]["reservation"]["warnings"] == [TYPO_WARNING]
    after = await _counts(clean_db)
    assert after["reservations"] == before["reservations"] + 3
    assert after["allocations"] == before["allocations"] + 2


@pytest.fixture
async def lease_client(database_url: str, clean_db: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    """An admin client of the real app with ``BC_CAPACITY_PLACER=pool-lease``."""
    from app.main import create_app

    application = create_app(settings_for(database_url, capacity_placer="pool-lease"), run_migrations=False)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers) as c:
            yield c


async def test_the_pool_lease_create_refuses_before_queueing(
    lease_client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    pool = await _pool(lease_client)
    before = await _counts(clean_db)
    for body, code, message, path in _refusals(pool):
        r = await lease_client.post("/v1/reservations", json=body)
        assert r.status_code == 422, r.text
        _check_refusal(r, code, message, path)
    assert await _counts(clean_db) == before
    body = reservation(pool, 0, devices=[{"class": "gpu", "count": 1, "selector": TYPO}])
    queued = await lease_client.post("/v1/reservations", json=body)
    assert queued.status_code == 202 and queued.json()["warnings"] == [TYPO_WARNING]


async def test_a_node_added_later_is_seen_by_the_next_request(admin_client: httpx.AsyncClient) -> None:
    pool = await _pool(admin_client)
    r = await admin_client.post("/v1/reservations", json=reservation(pool, 16))
    assert r.status_code == 422 and r.json()["error"]["code"] == "UNSATISFIABLE"
    await add_node(admin_client, pool, gpu_node("big", 16))
    r = await admin_client.post("/v1/reservations", json=reservation(pool, 16))
    assert r.status_code == 201 and r.json()["status"] == "placed", r.text
