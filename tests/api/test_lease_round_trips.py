"""The round trips of the pool-lease path (issue 15), counted on the app's own engine: a queued POST is
one statement in its transaction, a long-poll woken by its decision answers the view the ``bc_decided``
line carries (no read after the first), and a long-poll is not woken by other reservations' decisions.

The app's batch worker and wake controller are stopped (their ``run`` does nothing) and its periodic
tasks slowed down, so that only the request's round trips are counted: the tests decide the queued
reservations themselves, with :func:`app.capacity.queue.worker.work_batch` on the test engine (not counted).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.answers.reservations import Reservation, ReservationSpec
from app.answers.statuses import ReservationStatus
from app.capacity.controllers.wake import WakeController
from app.capacity.planning.snapshot import PoolCache
from app.capacity.queue import worker as queue
from app.capacity.queue.decided import decided_payloads, parse_decided, read_view_json
from tests.api.test_authorization import build_world
from tests.conftest import ADMIN_KEY, settings_for
from tests.factories import add_node, gpu_node, make_pool, reservation
from tests.round_trips import counting

# checkout, BEGIN, INSERT ... SELECT ... RETURNING pg_notify(...), the audit row (written before COMMIT with
# the 202 it answers: app/db/audit.py), COMMIT
MAX_POST_ROUND_TRIPS = 5
# the whole long-poll: checkout and one statement (autocommit); none once woken with the view
MAX_LONG_POLL_ROUND_TRIPS = 2


async def _idle(self: Any, engine: AsyncEngine) -> int:
    return 0


@pytest.fixture
async def idle_lease_app(
    database_url: str, clean_db: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Any]:
    """The pool-lease app with its LISTEN connection (long-polls are woken) but no batch worker."""
    from app.main import create_app

    monkeypatch.setattr(queue.QueueWorker, "run", _idle)
    monkeypatch.setattr(WakeController, "run", _idle)  # adding a node sends a wake edge: no wake here
    monkeypatch.setattr(queue, "RECHECK_SECONDS", 30.0)  # no periodic re-read within a test
    quiet = {"lifecycle_interval": 3600, "lifecycle_sweep": 3600, "node_liveness_sweep_seconds": 3600}
    settings = settings_for(database_url, capacity_placer="pool-lease", **quiet)
    application = create_app(settings, run_migrations=False)
    async with application.router.lifespan_context(application):
        lifecycle = application.state.lifecycle
        periodic = [name for name in lifecycle.runs if not name.endswith("-listener")]
        for _ in range(500):  # listening, and each periodic task's first run over: none straddles a count
            if application.state.queue.listening and all(lifecycle.runs[n] for n in periodic):
                break
            await asyncio.sleep(0.01)
        assert application.state.queue.listening
        yield application


@pytest.fixture
async def client(idle_lease_app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=idle_lease_app)
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(
        transport=transport, base_url="http://test", headers=headers, timeout=60
    ) as c:
        yield c


async def _queued(client: httpx.AsyncClient, pool: str) -> str:
    r = await client.post("/v1/reservations", json=reservation(pool, 1, resources={"cpu": 2}))
    assert r.status_code == 202 and r.json()["status"] == "queued", r.text
    return str(r.json()["id"])


async def _parked(worker: queue.QueueWorker, reservation_id: str) -> None:
    for _ in range(500):
        if worker.waiting(reservation_id):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no long-poll waits on {reservation_id}")


def _config(app: Any, max_batch: int) -> Any:
    return replace(app.state.services.capacity, max_batch=max_batch)


async def test_a_queued_post_takes_one_statement_in_its_transaction(
    idle_lease_app: Any, client: httpx.AsyncClient
) -> None:
    pool = await make_pool(client)
    await add_node(client, pool, gpu_node("rt-a"))
    for _ in range(2):  # warm: statements prepared on the pooled connections
        await _queued(client, pool)
    with counting(idle_lease_app.state.services.engine) as trips:
        await _queued(client, pool)
    assert trips.count <= MAX_POST_ROUND_TRIPS, f"{trips.count} round trips:\n{trips}"


async def test_a_woken_long_poll_answers_the_carried_view_without_a_read(
    idle_lease_app: Any, client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    pool = await make_pool(client)
    await add_node(client, pool, gpu_node("rt-b"))
    worker: queue.QueueWorker = idle_lease_app.state.queue
    rid = await _queued(client, pool)
    with counting(idle_lease_app.state.services.engine) as trips:
        poll = asyncio.create_task(client.get(f"/v1/reservations/{rid}", params={"waitSeconds": 10}))
        await _parked(worker, rid)
        await asyncio.sleep(0.2)  # its first read done: it waits
        assert await queue.work_batch(clean_db, PoolCache(), _config(idle_lease_app, 64), pool) == 1
        got = await poll
    assert got.status_code == 200 and got.json()["status"] == "placed", got.text
    assert trips.count <= MAX_LONG_POLL_ROUND_TRIPS, f"{trips.count} round trips:\n{trips}"
    # the view the bc_decided line carried is the one a read answers
    assert got.json() == (await client.get(f"/v1/reservations/{rid}")).json()


async def test_a_long_poll_is_not_woken_by_other_reservations_decisions(
    idle_lease_app: Any, client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    pool = await make_pool(client)
    await add_node(client, pool, gpu_node("rt-c"))
    worker: queue.QueueWorker = idle_lease_app.state.queue
    older = await _queued(client, pool)
    rid = await _queued(client, pool)
    one_at_a_time = _config(idle_lease_app, 1)
    poll = asyncio.create_task(client.get(f"/v1/reservations/{rid}", params={"waitSeconds": 10}))
    await _parked(worker, rid)
    await asyncio.sleep(0.2)
    with counting(idle_lease_app.state.services.engine) as trips:
        assert await queue.work_batch(clean_db, PoolCache(), one_at_a_time, pool) == 1  # the older one
        await asyncio.sleep(0.3)  # its bc_decided is heard meanwhile
    assert trips.count == 0, f"woken by another reservation's decision:\n{trips}"
    assert not poll.done()
    assert (await client.get(f"/v1/reservations/{older}")).json()["status"] == "placed"
    assert await queue.work_batch(clean_db, PoolCache(), one_at_a_time, pool) == 1
    got = await poll
    assert got.status_code == 200 and got.json()["status"] == "placed", got.text


async def test_a_bare_id_wakes_the_long_poll_which_reads(
    idle_lease_app: Any, client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    pool = await make_pool(client)
    await add_node(client, pool, gpu_node("rt-d"))
    worker: queue.QueueWorker = idle_lease_app.state.queue
    rid = await _queued(client, pool)
    poll = asyncio.create_task(client.get(f"/v1/reservations/{rid}", params={"waitSeconds": 10}))
    await _parked(worker, rid)
    assert await queue.work_batch(clean_db, PoolCache(), _config(idle_lease_app, 64), pool) == 1
    got = await poll
    assert got.json()["status"] == "placed"
    # a view too long for a payload travels as its bare id: the waiter reads the reservation
    rid = await _queued(client, pool)
    poll = asyncio.create_task(client.get(f"/v1/reservations/{rid}", params={"waitSeconds": 10}))
    await _parked(worker, rid)
    await asyncio.sleep(0.2)
    worker.heard_decided(f"res_other\t{{}}\n{rid}")
    with counting(idle_lease_app.state.services.engine) as trips:
        await asyncio.sleep(0.3)
    assert trips.count >= 1 and not poll.done()  # read: still queued, so it waits on
    poll.cancel()


def _padded_view(reservation_id: str, pad: int) -> Reservation:
    """A placed reservation whose idempotency key is ``pad`` characters long."""
    spec = ReservationSpec(
        tenantId="t",
        poolId="p",
        devices=[],
        resources={"cpu": 2},
        start=None,
        duration="1h",
        binding="device",
        gang=None,
        spot=False,
    )
    return Reservation(
        id=reservation_id,
        tenantId="t",
        poolId="p",
        status=ReservationStatus.placed,
        idempotencyKey="k" * pad,
        spec=spec,
        allocations=[],
        conditions=[],
        createdAt="2026-12-01T12:00:00+00:00",
        releasedAt=None,
        plannedStart=None,
    )


def test_decided_payloads_stay_under_the_limit_and_parse_back() -> None:
    views = [_padded_view(f"res_{i:03}", 300) for i in range(40)]
    views.append(_padded_view("res_huge", 9000))
    payloads = decided_payloads(views, limit=2000)
    assert len(payloads) > 1 and all(len(p.encode()) < 2000 for p in payloads)
    lines = [line for p in payloads for line in parse_decided(p)]
    assert [rid for rid, _ in lines] == [v.id for v in views]
    assert lines[-1] == ("res_huge", "")  # too long: the bare id
    assert [read_view_json(text) for _, text in lines[:-1]] == views[:-1]


async def test_the_long_poll_is_authorized_as_the_plain_get(
    admin_client: httpx.AsyncClient, client_for: Any
) -> None:
    world = await build_world(admin_client)
    for who, key in world.keys.items():  # anonymous 401, admin 200, tenant B 404, no grant 403, ...
        async with client_for(key) as c:
            plain = await c.get(f"/v1/reservations/{world.reservation_a}")
            polled = await c.get(f"/v1/reservations/{world.reservation_a}", params={"waitSeconds": 5})
            missing = await c.get("/v1/reservations/res_nope", params={"waitSeconds": 5})
        assert (polled.status_code, polled.json()) == (plain.status_code, plain.json()), who
        if key is not None:
            assert missing.status_code == 404, (who, missing.text)
