"""Races of the pool-lease placer and the bulk create with two real service processes (issue 15,
"Done when" 2).

``test_pool_lease_and_bulk_race_inline_releases_and_inventory``: two ``serve`` processes with
``BC_CAPACITY_PLACER=pool-lease`` (batches of at most 4, so many batches race) share the test database.
16 clients queue plain reservations (202, then ``GET ?waitSeconds=30``), send bulk calls of 6 items,
reserve gangs (inline even with pool-lease), release what they hold, and cordon / uncordon nodes and add
one, alternating between the servers, on a pool of 3 nodes x 4 GPUs (cpu 12 each). While they run, and
after, the SQL checks of the invariants sweep (tests/capacity/invariants.py) find no double booking at any
instant and exact counters. Nothing is lost: every reservation a client was answered exists, none is
left queued, and the database holds no reservation nobody was answered.

``test_a_batch_of_a_killed_worker_is_decided_by_another_replica``: process A's worker claims queued
reservations and waits for the pool row (the test holds it ``FOR NO KEY UPDATE``); A is killed with
SIGKILL; its transaction is rolled back when PostgreSQL notices; process B takes the rows and decides
every one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.capacity.invariants import violations as _violations
from tests.factories import add_node, gpu_node, make_pool
from tests.servers import Server, admin_clients, running_server, running_servers

pytestmark = pytest.mark.slow  # a long module: it starts early in a parallel run (tests/conftest.py)

# small connection pools: the machine's PostgreSQL (100 connections) is shared with other test runs
LEASE_ENV = {
    "BC_CAPACITY_PLACER": "pool-lease",
    "BC_CAPACITY_MAX_BATCH": "4",
    "BC_LIFECYCLE_SWEEP": "2",
    "BC_DB_POOL_SIZE": "6",
}
CLIENTS = 12
ROUNDS = 8
TENANTS = [f"race-t{i}" for i in range(4)]
QUOTA = {"gpu": 8, "cpu": 24}


class Retrying:
    """A client that sends a request again after 503 UNAVAILABLE (nothing was committed; every request
    here is safe to repeat), as a real client honouring Retry-After would: the machine's PostgreSQL is
    shared with other test runs and may briefly have no connection slot free."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        for _ in range(10):
            r = await self.client.request(method, url, **kwargs)
            if r.status_code != 503:
                return r
            await asyncio.sleep(0.5)
        return r

    async def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return await self.request("GET", url, **kwargs)

    async def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return await self.request("POST", url, **kwargs)


class Load:
    """The clients' side: what they were answered, and what they hold."""

    def __init__(self, clients: list[httpx.AsyncClient], pool: str, nodes: list[str]) -> None:
        self.clients = [Retrying(c) for c in clients]
        self.pool = pool
        self.nodes = nodes
        self.answered: set[str] = set()  # every reservation id a client was answered
        self.held: set[str] = set()
        self.unexpected: list[str] = []
        self.kinds: dict[str, int] = {}
        self._keys = 0

    def body(self, worker: int, gpus: int, **extra: Any) -> dict[str, Any]:
        self._keys += 1
        body: dict[str, Any] = {
            "tenantId": TENANTS[worker % len(TENANTS)],
            "poolId": self.pool,
            "devices": [{"class": "gpu", "count": gpus}],
            "duration": "1h",
            "idempotencyKey": f"race-{worker}-{self._keys}",
        }
        if random.random() < 0.3:
            body["resources"] = {"cpu": random.choice([2, 4])}
        body.update(extra)
        return body

    def count(self, kind: str) -> None:
        self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def took(self, view: dict[str, Any], what: str) -> None:
        self.answered.add(view["id"])
        status = view["status"]
        self.count(status)
        if status == "placed":
            self.held.add(view["id"])
        elif status != "pending":
            self.unexpected.append(f"{what}: status {status}")

    async def queue_one(self, worker: int) -> None:
        c = self.clients[worker % 2]
        r = await c.post("/v1/reservations", json=self.body(worker, random.choice([1, 2, 4])))
        if r.status_code != 202 or r.json()["status"] != "queued":
            self.unexpected.append(f"queue: {r.status_code} {r.text[:300]}")
            return
        rid = r.json()["id"]
        self.answered.add(rid)
        got = await self.clients[(worker + 1) % 2].get(f"/v1/reservations/{rid}", params={"waitSeconds": 30})
        if got.status_code != 200 or got.json()["status"] == "queued":
            self.unexpected.append(f"wait {rid}: {got.status_code} {got.text[:300]}")
            return
        self.took(got.json(), "queued")

    async def bulk(self, worker: int) -> None:
        items = [self.body(worker, random.choice([1, 2])) for _ in range(6)]
        r = await self.clients[worker % 2].post("/v1/reservations/batch", json={"items": items})
        if r.status_code != 200:
            self.unexpected.append(f"bulk: {r.status_code} {r.text[:300]}")
            return
        for answer in r.json()["items"]:
            if answer["status"] == 201:
                self.took(answer["reservation"], "bulk")
            elif answer["status"] == 409 and answer["error"]["code"] == "QUOTA_EXCEEDED":
                self.count("quota")
            else:
                self.unexpected.append(f"bulk item: {answer}")

    async def gang(self, worker: int) -> None:
        r = await self.clients[worker % 2].post(
            "/v1/reservations", json=self.body(worker, 1, gang={"members": 2})
        )
        if r.status_code == 201:
            self.took(r.json(), "gang")
        elif r.status_code == 409 and r.json()["error"]["code"] == "QUOTA_EXCEEDED":
            self.count("quota")
        else:
            self.unexpected.append(f"gang: {r.status_code} {r.text[:300]}")

    async def release_some(self, worker: int) -> None:
        mine = sorted(self.held)
        for rid in random.sample(mine, min(2, len(mine))):
            self.held.discard(rid)
            r = await self.clients[worker % 2].post(f"/v1/reservations/{rid}/release")
            if r.status_code != 200 or r.json()["status"] != "released":
                self.unexpected.append(f"release {rid}: {r.status_code} {r.text[:300]}")

    async def flap_node(self, worker: int) -> None:
        node = random.choice(self.nodes)
        c = self.clients[worker % 2]
        for action in ("cordon", "uncordon"):
            r = await c.post(f"/v1/nodes/{node}/{action}")
            if r.status_code != 200:
                self.unexpected.append(f"{action}: {r.status_code} {r.text[:300]}")


async def _client_loop(load: Load, worker: int) -> None:
    steps = [load.queue_one, load.queue_one, load.bulk, load.gang, load.release_some, load.flap_node]
    for _ in range(ROUNDS):
        await random.choice(steps)(worker)


async def _watch(engine: AsyncEngine, stop: asyncio.Event, found: list[Any]) -> None:
    """Run the stress test's checks again and again while the load runs."""
    while not stop.is_set():
        problems = await _violations(engine)
        if problems:
            found.append(problems)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.3)


async def _scalar(engine: AsyncEngine, sql: str) -> Any:
    async with engine.connect() as conn:
        return (await conn.exec_driver_sql(sql)).scalar_one()


@pytest.fixture
async def lease_servers(
    database_url: str, clean_db: AsyncEngine, tmp_path: Path
) -> AsyncIterator[tuple[list[Server], list[httpx.AsyncClient]]]:
    with running_servers(database_url, tmp_path, 2, LEASE_ENV) as servers:
        async with admin_clients(servers, 90.0, 4 * CLIENTS) as clients:
            yield servers, clients


async def test_pool_lease_and_bulk_race_inline_releases_and_inventory(
    lease_servers: tuple[list[Server], list[httpx.AsyncClient]], engine: AsyncEngine
) -> None:
    servers, clients = lease_servers
    admin = clients[0]
    pool = await make_pool(admin, f"race-{os.getpid()}-{time.monotonic_ns()}")
    nodes = [(await add_node(admin, pool, gpu_node(f"race-n{i}", 4, cpu=12)))["id"] for i in range(3)]
    for tenant in TENANTS:
        r = await admin.put(f"/v1/tenants/{tenant}/quotas/{pool}", json={"limits": QUOTA})
        assert r.status_code == 200, r.text
    load = Load(clients, pool, nodes)
    stop, found = asyncio.Event(), []
    watcher = asyncio.create_task(_watch(engine, stop, found))

    async def add_late_node() -> None:
        await asyncio.sleep(1.0)
        load.nodes.append((await add_node(clients[1], pool, gpu_node("race-late", 4, cpu=12)))["id"])

    try:
        await asyncio.wait_for(
            asyncio.gather(add_late_node(), *(_client_loop(load, w) for w in range(CLIENTS))), timeout=240
        )
    finally:
        stop.set()
        await watcher
    logs = "\n".join(s.output()[-5000:] for s in servers)
    assert not load.unexpected, "\n".join(load.unexpected[:20]) + "\n" + logs
    assert not found, found[:3]
    assert load.kinds.get("placed", 0) > 0, load.kinds
    assert await _violations(engine) == {}
    # nothing lost: the database holds exactly the reservations clients were answered, none queued
    in_db = set(
        await _scalar(
            engine, f"SELECT coalesce(array_agg(id), '{{}}') FROM reservations WHERE pool_id = '{pool}'"
        )
    )
    assert in_db == load.answered, (len(in_db), len(load.answered))
    assert await _scalar(engine, "SELECT count(*) FROM reservations WHERE status = 'queued'") == 0
    # release everything: then nothing is booked or charged
    for rid in sorted(in_db):
        r = await clients[0].post(f"/v1/reservations/{rid}/release")
        assert r.status_code == 200, r.text
    assert await _violations(engine) == {}
    assert await _scalar(engine, "SELECT count(*) FROM device_bookings WHERE upper(during) > now()") == 0
    assert await _scalar(engine, "SELECT count(*) FROM scalar_holdings WHERE ends_at > now()") == 0
    assert await _scalar(engine, "SELECT count(*) FROM quota_holdings WHERE ends_at > now()") == 0
    for s in servers:
        assert s.process.poll() is None, f"server {s.port} died:\n{s.output()}"


async def _wait_for(engine: AsyncEngine, sql: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not await _scalar(engine, sql):
        assert time.monotonic() < deadline, f"not true in {within} s: {sql}"
        await asyncio.sleep(0.1)


async def test_a_batch_of_a_killed_worker_is_decided_by_another_replica(
    database_url: str, clean_db: AsyncEngine, engine: AsyncEngine, tmp_path: Path
) -> None:
    with running_server(database_url, tmp_path / "a", extra_env=LEASE_ENV) as a:
        async with admin_clients([a]) as (client_a,):
            pool = await make_pool(client_a, "killed")
            for i in range(2):
                await add_node(client_a, pool, gpu_node(f"killed-n{i}", 4, cpu=12))
            holder = await engine.connect()
            try:
                tx = await holder.begin()
                # the batch's pool lock (FOR SHARE) waits behind this; creating rows (FOR KEY SHARE) does not
                await holder.exec_driver_sql(f"SELECT 1 FROM pools WHERE id = '{pool}' FOR NO KEY UPDATE")
                ids = []
                for i in range(6):
                    body = {
                        "tenantId": "acme",
                        "poolId": pool,
                        "devices": [{"class": "gpu", "count": 1}],
                        "duration": "1h",
                        "idempotencyKey": f"killed-{i}",
                    }
                    r = await client_a.post("/v1/reservations", json=body)
                    assert r.status_code == 202, r.text
                    ids.append(r.json()["id"])
                # A's worker claimed a batch and waits for the pool row
                await _wait_for(
                    engine,
                    "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE '%FROM pools%'",
                )
                async with engine.begin() as probe:  # rows A holds are skipped
                    free = (
                        await probe.exec_driver_sql(
                            "SELECT count(*) FROM (SELECT id FROM reservations WHERE status = 'queued' "
                            "FOR UPDATE SKIP LOCKED) q"
                        )
                    ).scalar_one()
                    await probe.rollback()
                assert free < len(ids), "A's worker holds none of the queued rows"
                # B runs beside A (its worker skips A's rows and waits for the pool row too)
                with running_server(database_url, tmp_path / "b", extra_env=LEASE_ENV) as b:
                    async with admin_clients([b]) as (client_b,):
                        os.killpg(a.process.pid, signal.SIGKILL)
                        a.process.wait(timeout=10)
                        await tx.commit()
                        for rid in ids:
                            got = await client_b.get(f"/v1/reservations/{rid}", params={"waitSeconds": 30})
                            assert got.status_code == 200, got.text
                            assert got.json()["status"] == "placed", got.text
            finally:
                await holder.close()
    assert await _violations(engine) == {}
    assert await _scalar(engine, "SELECT count(*) FROM reservations WHERE status = 'queued'") == 0
