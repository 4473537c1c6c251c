"""A whole-node lease stays whole (issue 21, "Leases are of the node"; docs/lifecycle.md, "Whole-node
leases"): a ``binding: node`` lease placed, or repaired, while one of its node's GPUs is unhealthy books
that GPU too (held, not used), so once it heals no other tenant's work lands on the leased node in the
lease's window, through the inline create, the bulk route, the pool-lease worker or a wake; and a race of
a lease against device reservations on one node never shares the node."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.config import CapacityConfig
from app.capacity.controllers import repair
from app.capacity.placing.inline import Pending, place_inline
from app.capacity.planning.snapshot import PoolCache
from app.capacity.reservations.create import create_reservation
from app.inventory.schemas import NodeCreate
from app.placement.model import DeviceRequest, PlacementRequest
from app.placement.options import SchedulerOptions
from app.placement.request import ReservationRequest
from tests.capacity.helpers import db_time, make_pool_with_nodes, reservation_row
from tests.capacity.invariants import violations
from tests.conftest import ADMIN_KEY, settings_for
from tests.factories import add_node, gpu_node, make_pool, node_body, reservation

BROKEN = "GPU3"


async def _health(client: httpx.AsyncClient, node_id: str, atom: str, healthy: bool) -> None:
    body = {"devices": [{"id": atom, "healthy": healthy}]}
    r = await client.post(f"/v1/nodes/{node_id}/health", json=body)
    assert r.status_code == 200, r.text


async def _lease_with_a_healed_gpu(client: httpx.AsyncClient, name: str) -> tuple[str, dict, dict]:
    """A pool of one 4-GPU node whose GPU3 is unhealthy when a lease of 1 GPU takes the node, then
    healthy again; returns (pool id, node view, lease view)."""
    pool = await make_pool(client)
    node = await add_node(client, pool, gpu_node(name, 4, cpu=16, memory=None))
    await _health(client, node["id"], f"{name}-{BROKEN}", healthy=False)
    lease = (
        await client.post("/v1/reservations", json=reservation(pool, 1, tenant="lessee", binding="node"))
    ).json()
    assert lease["status"] == "placed", lease
    [alloc] = lease["allocations"]
    assert alloc["nodeId"] == node["id"] and f"{name}-{BROKEN}" not in alloc["atoms"]  # not in use
    await _health(client, node["id"], f"{name}-{BROKEN}", healthy=True)
    return pool, node, lease


async def _live_bookers(engine: AsyncEngine, atom: str) -> set[str]:
    """The reservations holding a live booking of ``atom``."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.text(
                "SELECT a.reservation_id FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id"
                " WHERE b.device_id = :atom AND upper(b.during) > now()"
            ),
            {"atom": atom},
        )
        return set(rows.scalars())


async def test_a_lease_placed_beside_an_unhealthy_gpu_keeps_it_once_healed_inline_and_bulk(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    pool, node, lease = await _lease_with_a_healed_gpu(admin_client, "heal-inline")
    assert await _live_bookers(engine, f"heal-inline-{BROKEN}") == {lease["id"]}  # held by the lease
    # another tenant's GPU, its cpu alone, and the same through the bulk route: nothing lands
    gpu = (await admin_client.post("/v1/reservations", json=reservation(pool, 1, tenant="b"))).json()
    cpu = (
        await admin_client.post(
            "/v1/reservations", json=reservation(pool, 0, tenant="b", resources={"cpu": 1})
        )
    ).json()
    for view in (gpu, cpu):
        assert view["status"] == "pending", view
    bulk = await admin_client.post(
        "/v1/reservations/batch",
        json={
            "items": [
                reservation(pool, 1, tenant="c"),
                reservation(pool, 0, tenant="c", resources={"cpu": 1}),
            ]
        },
    )
    assert bulk.status_code == 200, bulk.text
    for item in bulk.json()["items"]:
        assert item["status"] == 201 and item["reservation"]["status"] == "pending", item
    # a lease of a node that is not whole is no repair case: the lease keeps its allocation
    assert lease["id"] not in await _broken(engine)
    assert await violations(engine) == {}

    # the release frees the whole node, the healed GPU included: the pending ones are woken onto it
    assert (await admin_client.post(f"/v1/reservations/{lease['id']}/release")).status_code == 200
    woken = await _wait_placed(admin_client, gpu["id"])
    assert woken["allocations"][0]["nodeId"] == node["id"]
    assert await violations(engine) == {}


async def _broken(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        return await repair.broken_reservations(conn)


async def _wait_placed(client: httpx.AsyncClient, reservation_id: str, within: float = 10.0) -> dict:
    deadline = time.monotonic() + within
    while True:
        view = (await client.get(f"/v1/reservations/{reservation_id}")).json()
        if view["status"] == "placed" or time.monotonic() > deadline:
            assert view["status"] == "placed", view
            return view
        await asyncio.sleep(0.02)


async def test_a_repaired_lease_keeps_the_broken_gpu_once_healed(
    admin_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """BookingRepair re-leases the same node without the broken GPU in use, but still booked: once it
    heals, nothing else lands on the node; the repaired lease is not repaired again."""
    pool = await make_pool(admin_client)
    node = await add_node(admin_client, pool, gpu_node("heal-repair", 4, cpu=16, memory=None))
    lease = (
        await admin_client.post(
            "/v1/reservations", json=reservation(pool, 1, tenant="lessee", binding="node")
        )
    ).json()
    [alloc] = lease["allocations"]
    broken = alloc["atoms"][0]  # an atom the lease uses
    await _health(admin_client, node["id"], broken, healthy=False)
    deadline = time.monotonic() + 10
    while True:
        view = (await admin_client.get(f"/v1/reservations/{lease['id']}")).json()
        if len(view["allocations"]) == 2 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    assert view["status"] == "placed" and len(view["allocations"]) == 2, view
    new = view["allocations"][1]
    assert new["nodeId"] == node["id"] and broken not in new["atoms"]  # re-leased, the broken GPU unused
    assert await _live_bookers(engine, broken) == {lease["id"]}  # ... but held
    assert lease["id"] not in await _broken(engine)  # settled: no repair loop
    await _health(admin_client, node["id"], broken, healthy=True)
    other = (await admin_client.post("/v1/reservations", json=reservation(pool, 1, tenant="b"))).json()
    assert other["status"] == "pending", other
    assert await violations(engine) == {}


@pytest.fixture
async def pool_lease_client(database_url: str, clean_db: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    """An admin client of the real app with ``BC_CAPACITY_PLACER=pool-lease`` (its batch worker running;
    a lease still places inline)."""
    from app.main import create_app

    application = create_app(settings_for(database_url, capacity_placer="pool-lease"), run_migrations=False)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://test", headers=headers, timeout=60
        ) as client:
            yield client


async def test_the_pool_lease_worker_does_not_place_on_a_healed_gpu_of_a_leased_node(
    pool_lease_client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    client = pool_lease_client
    pool, _, lease = await _lease_with_a_healed_gpu(client, "heal-queue")
    queued = await client.post("/v1/reservations", json=reservation(pool, 1, tenant="b"))
    assert queued.status_code == 202, queued.text
    got = await client.get(f"/v1/reservations/{queued.json()['id']}", params={"waitSeconds": 10})
    assert got.json()["status"] == "pending", got.json()
    assert await _live_bookers(engine, f"heal-queue-{BROKEN}") == {lease["id"]}
    assert await violations(engine) == {}


async def _race_round(
    engine: AsyncEngine, config: CapacityConfig, name: str, others: int, reverse: bool
) -> list[str]:
    """One round on a fresh pool of one 4-GPU node whose GPU3 is unhealthy: a lease of 1 GPU, the heal
    of GPU3 and ``others`` reservations of other tenants (1 GPU, or cpu alone for every third), all at
    once on their own connections; the outcomes."""
    pool, _ = await make_pool_with_nodes(engine, [node_body(name, 4, cpu=16)])
    broken = f"{name}-GPU3"
    async with engine.begin() as conn:
        await conn.execute(sa.text("UPDATE devices SET healthy = false WHERE id = :id"), {"id": broken})

    async def create(kind: str, i: int, **extra: Any) -> str:
        body = {"tenantId": f"t{i}", "poolId": pool, "duration": "1h", "idempotencyKey": f"{name}-{i}"}
        request = ReservationRequest.model_validate({**body, **extra})
        # a cache per racer: no assumption of another racer's plan keeps the race from the guarded commit
        view, _ = await create_reservation(engine, PoolCache(), config, request)
        return f"{kind} {view.status}"

    async def heal() -> str:
        async with engine.begin() as conn:
            await conn.execute(sa.text("UPDATE devices SET healthy = true WHERE id = :id"), {"id": broken})
        return "healed"

    gpu = [{"class": "gpu", "count": 1}]
    racers = [create("lease", 0, devices=gpu, binding="node"), heal()]
    racers += [
        create("device", i, resources={"cpu": 1}) if i % 3 == 0 else create("device", i, devices=gpu)
        for i in range(1, others + 1)
    ]
    return list(await asyncio.gather(*(reversed(racers) if reverse else racers)))


async def test_a_lease_races_device_reservations_and_a_heal_on_one_node(clean_db: AsyncEngine) -> None:
    """Several connections at once, round after round: a lease of a node with an unhealthy GPU, device
    and cpu reservations of other tenants on the same node, and the GPU healed meanwhile. Whoever wins,
    the leased node is never shared and no device is booked twice."""
    engine = clean_db
    config = CapacityConfig(SchedulerOptions())
    outcomes: list[str] = []
    for round_ in range(8):
        outcomes += await _race_round(engine, config, f"race-{round_}", round_ % 4, reverse=bool(round_ % 2))
    assert "lease placed" in outcomes and "device placed" in outcomes, outcomes  # both sides won
    assert await violations(engine) == {}, outcomes


async def test_a_gpu_healed_and_booked_between_a_leases_plan_and_commit_makes_the_lease_lose(
    clean_db: AsyncEngine,
) -> None:
    """The lease is planned while GPU3 (the node's one H200) is unhealthy; before it commits, GPU3 heals
    and other tenants' reservations for an H200, each on its own connection, race for it and one
    commits. The lease's guarded commit books GPU3 too, so it loses that race and replans: the node
    now holds other work, and the lease is left pending instead of sharing the node."""
    engine = clean_db
    body = gpu_node("mid", 4, cpu=16, memory=None, attributes={"gpuProduct": "H100"})
    body["devices"][3]["attributes"] = {"gpuProduct": "H200"}
    pool, _ = await make_pool_with_nodes(engine, [NodeCreate.model_validate(body)])
    async with engine.begin() as conn:
        await conn.execute(sa.text("UPDATE devices SET healthy = false WHERE id = 'mid-GPU3'"))
    start = await db_time(engine)
    config = CapacityConfig(SchedulerOptions())
    h200 = {"matchExpressions": [{"key": "gpuProduct", "op": "In", "values": ["H200"]}]}
    others: list[str] = []

    async def heal_and_book(attempt: int, candidate: Any) -> None:
        if attempt != 1:
            return
        async with engine.begin() as conn:
            await conn.execute(sa.text("UPDATE devices SET healthy = true WHERE id = 'mid-GPU3'"))

        async def device(i: int) -> str:
            request = ReservationRequest.model_validate(
                {
                    "tenantId": f"b{i}",
                    "poolId": pool,
                    "devices": [{"class": "gpu", "count": 1, "selector": h200}],
                    "duration": "1h",
                    "idempotencyKey": f"mid-{i}",
                }
            )
            view, _ = await create_reservation(engine, PoolCache(), config, request)
            return str(view.status)

        others.extend(await asyncio.gather(*(device(i) for i in range(3))))

    request = PlacementRequest(
        tenant_id="lessee",
        pool_id=pool,
        devices=(DeviceRequest("gpu", 1),),
        start=start,
        end=start + timedelta(hours=1),
        binding="node",
    )
    async with engine.begin() as conn:
        res = await reservation_row(conn, pool, tenant="lessee")
        outcome = await place_inline(
            conn, PoolCache(), request, res, SchedulerOptions(), 3, before_commit=heal_and_book
        )
    assert sorted(others) == ["pending", "pending", "placed"], others  # GPU3 went to one of them
    assert isinstance(outcome, Pending), outcome
    assert await violations(engine) == {}
