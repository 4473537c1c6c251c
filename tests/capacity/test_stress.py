"""Stress: two real service processes, 32 concurrent clients, one small pool (issue 4, "Done when" 1).

Two ``python -m app.cli serve`` processes share the test database. 32 ``httpx.AsyncClient`` workers,
spread over 8 tenants with quotas, reserve mixed shapes (1, 2 or 4 GPUs, some with cpu and memory, some
cpu alone) and release them, alternating between the servers, on a pool of 3 nodes x 4 GPUs, so most
requests collide on the same nodes and atoms. Some steps race on purpose: one reservation released
through both servers at once, one idempotency key created through both servers at once.

The first wave is synchronized: all 32 workers reserve at once and nobody releases until every answer
is in. The wave asks for at least 32 GPUs of a 12-GPU pool, so at most 12 of its requests can be placed
and the rest must answer pending (or QUOTA_EXCEEDED): contention is certain, not hoped for.

Afterwards SQL checks the books with reservations still live, and again after everything is released:
no device has overlapping bookings, scalar ``allocated`` equals the live allocations, quota usage equals
the tenants' placed reservations, every placed reservation's atoms equal its bookings, released
reservations hold nothing, and the pool rollup equals live usage. No answer may be a 5xx.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import ADMIN_KEY
from tests.factories import add_node, gpu_node, make_pool
from tests.servers import Server, running_servers

REPO = Path(__file__).resolve().parents[2]
SERVERS = 2
WORKERS = 32
ROUNDS = 10  # steps per worker after the synchronized first wave
NODES = 3
GPUS_PER_NODE = 4
NODE_CPU = 12
NODE_MEMORY = 64_000
TENANTS = [f"stress-t{i}" for i in range(8)]
QUOTA = {"gpu": 6, "cpu": 16}  # memory stays unlimited (still counted)
# (gpus, resources): mixed shapes, some with scalars, one scalar-only
SHAPES: list[tuple[int, dict[str, int]]] = [
    (1, {}),
    (1, {"cpu": 2}),
    (2, {}),
    (2, {"cpu": 4, "memory": 8_000}),
    (4, {}),
    (4, {"cpu": 6}),
    (0, {"cpu": 4}),
]
GANG_SHARE = 0.2  # a fifth of later requests are gangs of two members of the shape, on distinct nodes
STARTUP_SECONDS = 60.0
REQUEST_TIMEOUT = 60.0


@pytest.fixture
def servers(database_url: str, clean_db: AsyncEngine, tmp_path: Path) -> Iterator[list[Server]]:
    """Two service processes on free ports of 127.0.0.1, on the (clean) test database; stopped after."""
    with running_servers(database_url, tmp_path, SERVERS, startup_seconds=STARTUP_SECONDS) as started:
        yield started


# ------------------------------------------------------------------------------------------ workload


@dataclass
class Tally:
    """What the clients saw: answers by kind, unexpected answers, and the reservations they hold."""

    answers: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    first_wave: list[str] = field(default_factory=list)
    first_wave_gpus_placed: int = 0
    placed_ids: set[str] = field(default_factory=set)
    released_ids: set[str] = field(default_factory=set)
    pending_reasons: Counter[str] = field(default_factory=Counter)

    def bad(self, what: str, response: httpx.Response) -> None:
        """Record an answer the test does not accept."""
        self.unexpected.append(f"{what}: {response.status_code} {response.text[:500]}")


def _body(
    pool_id: str, tenant: str, key: str, shape: tuple[int, dict[str, int]], members: int = 1
) -> dict[str, Any]:
    gpus, resources = shape
    body: dict[str, Any] = {
        "tenantId": tenant,
        "poolId": pool_id,
        "devices": [{"class": "gpu", "count": gpus}] if gpus else [],
        "duration": "1d",
        "idempotencyKey": key,
    }
    if resources:
        body["resources"] = resources
    if members > 1:
        body["gang"] = {"members": members}
    return body


class Workload:
    """The clients' side: reserve / release helpers that check every answer's shape."""

    def __init__(self, clients: list[httpx.AsyncClient], pool_id: str, node_ids: set[str]) -> None:
        self.clients = clients
        self.pool_id = pool_id
        self.node_ids = node_ids
        self.tally = Tally()
        self._keys = 0

    def key(self, worker: int) -> str:
        """A fresh idempotency key."""
        self._keys += 1
        return f"stress-{worker}-{self._keys}"

    def _check_reserved(self, body: dict[str, Any], view: dict[str, Any], what: str) -> str:
        """Check a 200/201 reservation view; returns its status (placed / pending)."""
        status = view.get("status")
        gpus = body["devices"][0]["count"] if body["devices"] else 0
        members = body.get("gang", {}).get("members", 1)
        if status == "placed":
            allocs = view["allocations"]
            ok = (
                len(allocs) == members
                and len({a["nodeId"] for a in allocs}) == members  # a gang's members on distinct nodes
                and all(
                    len(a["atoms"]) == gpus
                    and len(set(a["atoms"])) == gpus
                    and a["nodeId"] in self.node_ids
                    and {k: float(v) for k, v in a["resources"].items()}
                    == {k: float(v) for k, v in body.get("resources", {}).items()}
                    for a in allocs
                )
            )
            if not ok:
                self.tally.unexpected.append(f"{what}: placed view does not match the request: {view}")
            self.tally.placed_ids.add(view["id"])
        elif status == "pending":
            conditions = view.get("conditions") or []
            message = conditions[0].get("message", "") if conditions else ""
            if view["allocations"] or not message:
                self.tally.unexpected.append(f"{what}: pending view without a reason or with allocations")
            kind = "lost races" if message.startswith("Unschedulable after") else message.split("(")[0]
            self.tally.pending_reasons[kind.strip()] += 1
        else:
            self.tally.unexpected.append(f"{what}: status {status!r}: {view}")
        return str(status)

    async def reserve(self, server: int, body: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
        """POST a reservation; returns ``(kind, view)`` with kind placed / pending / quota / error."""
        r = await self.clients[server].post("/v1/reservations", json=body)
        return self._reserve_answer(r, body, created=True)

    def _reserve_answer(
        self, r: httpx.Response, body: dict[str, Any], created: bool
    ) -> tuple[str, dict[str, Any] | None]:
        what = f"reserve {body['idempotencyKey']}"
        if r.status_code in ((201,) if created else (200, 201)):
            view = r.json()
            kind = self._check_reserved(body, view, what)
            self.tally.answers[kind] += 1
            return kind, view
        if r.status_code == 409 and r.json().get("error", {}).get("code") == "QUOTA_EXCEEDED":
            self.tally.answers["quota"] += 1
            return "quota", None
        self.tally.answers[f"http {r.status_code}"] += 1
        self.tally.bad(what, r)
        return "error", None

    async def release(self, server: int, reservation_id: str) -> None:
        """Release through ``server``; the answer must be 200 ``released``."""
        r = await self.clients[server].post(f"/v1/reservations/{reservation_id}/release")
        self.tally.answers[f"release {r.status_code}"] += 1
        if (
            r.status_code != 200
            or r.json().get("status") != "released"
            or r.json().get("allocations")
            and any(a.get("releasedAt") is None for a in r.json()["allocations"])
        ):
            self.tally.bad(f"release {reservation_id}", r)
        else:
            self.tally.released_ids.add(reservation_id)

    async def release_twice(self, reservation_id: str) -> None:
        """Release one reservation through both servers at once (both answer 200, refund once)."""
        await asyncio.gather(*(self.release(s, reservation_id) for s in range(len(self.clients))))

    async def create_twice(self, worker: int, body: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
        """Create one idempotency key through both servers at once: at most one reservation results."""
        answers = await asyncio.gather(
            *(self.clients[s].post("/v1/reservations", json=body) for s in range(len(self.clients)))
        )
        results = [self._reserve_answer(r, body, created=False) for r in answers]
        ids = {view["id"] for _, view in results if view is not None}
        created = sum(1 for r in answers if r.status_code == 201)
        if len(ids) > 1 or created > 1 or (ids and created != 1):
            self.tally.unexpected.append(
                f"idempotent create {body['idempotencyKey']}: ids {ids}, "
                f"codes {[r.status_code for r in answers]}"
            )
        for kind, view in results:
            if view is not None:
                return kind, view
        return results[0]


async def _worker(
    load: Workload, worker: int, start: asyncio.Barrier, first_done: asyncio.Barrier
) -> list[str]:
    """One client: a synchronized first reserve, then ``ROUNDS`` seeded steps; returns what it holds."""
    rng = random.Random(7919 * (worker + 1))
    tenant = TENANTS[worker % len(TENANTS)]
    held: list[str] = []

    def server() -> int:
        return rng.randrange(len(load.clients))

    # wave 1: every worker asks for at least one GPU at the same moment; nobody releases yet
    shape = rng.choice([s for s in SHAPES if s[0] > 0])
    await start.wait()
    kind, view = await load.reserve(
        worker % len(load.clients), _body(load.pool_id, tenant, load.key(worker), shape)
    )
    load.tally.first_wave.append(kind)
    if kind == "placed" and view is not None:
        load.tally.first_wave_gpus_placed += shape[0]
        held.append(view["id"])
    await first_done.wait()

    for _ in range(ROUNDS):
        roll = rng.random()
        if held and roll < 0.45:
            victim = held.pop(rng.randrange(len(held)))
            if rng.random() < 0.3:
                await load.release_twice(victim)
            else:
                await load.release(server(), victim)
            continue
        members = 2 if rng.random() < GANG_SHARE else 1
        body = _body(load.pool_id, tenant, load.key(worker), rng.choice(SHAPES), members)
        if roll < 0.55:
            kind, view = await load.create_twice(worker, body)
        else:
            kind, view = await load.reserve(server(), body)
        if kind == "placed" and view is not None:
            held.append(view["id"])
        if len(held) > 2:
            await load.release(server(), held.pop(0))
    return held


# ------------------------------------------------------------------------------------------ SQL checks

CHECKS: dict[str, str] = {
    # two bookings of one device whose windows overlap
    "overlapping bookings": """
        SELECT a.device_id, a.allocation_id, b.allocation_id
          FROM device_bookings a
          JOIN device_bookings b
            ON a.device_pk = b.device_pk AND a.allocation_id < b.allocation_id AND a.during && b.during
    """,
    # node_resources.allocated vs the sum of live allocations' resources on the node
    "scalar allocated != live allocations": """
        SELECT nr.node_id, nr.resource, nr.allocated, coalesce(live.n, 0) AS live
          FROM node_resources nr
          LEFT JOIN (
                SELECT a.node_id, r.key AS resource, sum(r.value::numeric) AS n
                  FROM allocations a, jsonb_each_text(a.resources) r
                 WHERE a.released_at IS NULL
                 GROUP BY 1, 2
          ) live ON live.node_id = nr.node_id AND live.resource = nr.resource
         WHERE nr.allocated <> coalesce(live.n, 0)
    """,
    # a scalar guard let a node go over floor(allocatable * ratio)
    "scalar over capacity": """
        SELECT node_id, resource, allocated FROM node_resources
         WHERE allocated > floor(allocatable * ratio)
    """,
    # quota_usage.used vs the sum over the tenant's placed reservations (from their specs)
    "quota usage != placed reservations": """
        WITH placed AS (
                SELECT tenant_id, pool_id, spec FROM reservations WHERE status = 'placed'
             ),
             wanted AS (  -- a gang charges every member
                SELECT tenant_id, pool_id, d->>'class' AS resource,
                       (d->>'count')::numeric * coalesce((spec->'gang'->>'members')::int, 1) AS n
                  FROM placed, jsonb_array_elements(spec->'devices') d
                UNION ALL
                SELECT tenant_id, pool_id, r.key,
                       r.value::numeric * coalesce((spec->'gang'->>'members')::int, 1)
                  FROM placed, jsonb_each_text(coalesce(spec->'resources', '{}'::jsonb)) r
             ),
             expected AS (
                SELECT tenant_id, pool_id, resource, sum(n) AS n FROM wanted GROUP BY 1, 2, 3
             )
        SELECT coalesce(q.tenant_id, e.tenant_id), coalesce(q.resource, e.resource),
               coalesce(q.used, 0), coalesce(e.n, 0)
          FROM quota_usage q
          FULL JOIN expected e
            ON e.tenant_id = q.tenant_id AND e.pool_id = q.pool_id AND e.resource = q.resource
         WHERE coalesce(q.used, 0) <> coalesce(e.n, 0)
    """,
    "quota over limit": """
        SELECT q.tenant_id, q.resource, q.used, l."limit"
          FROM quota_usage q
          JOIN quota_limits l USING (tenant_id, pool_id, resource)
         WHERE q.used > l."limit"
    """,
    # a placed reservation has one live allocation per member, on distinct nodes; others have none
    "placed reservation without one live allocation per member": """
        SELECT r.id, r.status, count(a.id)
          FROM reservations r
          LEFT JOIN allocations a ON a.reservation_id = r.id AND a.released_at IS NULL
         GROUP BY r.id, r.status, r.spec
        HAVING (r.status = 'placed') <> (count(a.id) = coalesce((r.spec->'gang'->>'members')::int, 1))
            OR count(a.id) > coalesce((r.spec->'gang'->>'members')::int, 1)
            OR count(a.id) <> count(DISTINCT a.node_id)
    """,
    # a pending reservation never keeps an allocation row (lost races roll back to the savepoint)
    "pending reservation with allocations": """
        SELECT r.id FROM reservations r JOIN allocations a ON a.reservation_id = r.id
         WHERE r.status = 'pending'
    """,
    # a live allocation's atoms are exactly its bookings, on its node, over its window
    "allocation atoms != bookings": """
        SELECT a.id, a.atoms, array_agg(b.device_id ORDER BY b.device_id)
          FROM allocations a
          LEFT JOIN device_bookings b ON b.allocation_id = a.id
         WHERE a.released_at IS NULL
         GROUP BY a.id, a.atoms
        HAVING coalesce(array_agg(b.device_id ORDER BY b.device_id) FILTER (WHERE b.device_id IS NOT NULL),
                        '{}'::text[])
               <> coalesce((SELECT array_agg(x ORDER BY x) FROM unnest(a.atoms) x), '{}'::text[])
    """,
    "booking on another node or window": """
        SELECT b.device_id, a.id
          FROM device_bookings b
          JOIN allocations a ON a.id = b.allocation_id
          JOIN devices d ON d.pk = b.device_pk
         WHERE d.node_id <> a.node_id OR d.id <> b.device_id OR b.during <> a.during
    """,
    # the atom count of a placed reservation is what its spec asked for
    "placed atoms != requested count": """
        SELECT r.id, cardinality(a.atoms), s.n
          FROM reservations r
          JOIN allocations a ON a.reservation_id = r.id AND a.released_at IS NULL
          CROSS JOIN LATERAL (
                SELECT coalesce(sum((d->>'count')::int), 0) AS n
                  FROM jsonb_array_elements(r.spec->'devices') d
          ) s
         WHERE r.status = 'placed' AND cardinality(a.atoms) <> s.n
    """,
    # released reservations hold no bookings and no live allocations
    "released reservation still booked": """
        SELECT r.id, b.device_id
          FROM reservations r
          JOIN allocations a ON a.reservation_id = r.id
          JOIN device_bookings b ON b.allocation_id = a.id
         WHERE r.status <> 'placed' OR a.released_at IS NOT NULL
    """,
    # pool_capacity_rollup.allocated vs live usage (atoms by class, scalars by name)
    "rollup != live usage": """
        WITH live AS (
                SELECT a.pool_id, d.class AS resource, count(*)::numeric AS n
                  FROM allocations a
                  JOIN device_bookings b ON b.allocation_id = a.id
                  JOIN devices d ON d.pk = b.device_pk
                 WHERE a.released_at IS NULL
                 GROUP BY 1, 2
                UNION ALL
                SELECT a.pool_id, r.key, sum(r.value::numeric)
                  FROM allocations a, jsonb_each_text(a.resources) r
                 WHERE a.released_at IS NULL
                 GROUP BY 1, 2
             ),
             expected AS (SELECT pool_id, resource, sum(n) AS n FROM live GROUP BY 1, 2)
        SELECT coalesce(p.pool_id, e.pool_id), coalesce(p.resource, e.resource),
               coalesce(p.allocated, 0), coalesce(e.n, 0)
          FROM pool_capacity_rollup p
          FULL JOIN expected e ON e.pool_id = p.pool_id AND e.resource = p.resource
         WHERE coalesce(p.allocated, 0) <> coalesce(e.n, 0)
    """,
}


async def _violations(engine: AsyncEngine) -> dict[str, list[tuple[Any, ...]]]:
    """Run every check; returns the failing ones with up to 10 offending rows each."""
    found: dict[str, list[tuple[Any, ...]]] = {}
    async with engine.connect() as conn:
        for name, sql in CHECKS.items():
            rows = [tuple(r) for r in (await conn.exec_driver_sql(sql)).all()]
            if rows:
                found[name] = rows[:10]
    return found


async def _scalar(engine: AsyncEngine, sql: str) -> Any:
    async with engine.connect() as conn:
        return (await conn.exec_driver_sql(sql)).scalar_one()


# ------------------------------------------------------------------------------------------ the test


@pytest.fixture
async def clients(servers: list[Server]) -> AsyncIterator[list[httpx.AsyncClient]]:
    """One admin ``httpx.AsyncClient`` per server."""
    limits = httpx.Limits(max_connections=2 * WORKERS, max_keepalive_connections=2 * WORKERS)
    made = [
        httpx.AsyncClient(
            base_url=s.url,
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=REQUEST_TIMEOUT,
            limits=limits,
        )
        for s in servers
    ]
    try:
        yield made
    finally:
        for c in made:
            await c.aclose()


async def test_two_servers_32_clients_never_double_book(
    servers: list[Server], clients: list[httpx.AsyncClient], engine: AsyncEngine
) -> None:
    """32 clients reserve and release through 2 processes; SQL finds the books exact, twice."""
    assert len(servers) >= 2 and len({s.process.pid for s in servers}) == len(servers)
    admin = clients[0]
    pool_id = await make_pool(admin, f"stress-{os.getpid()}-{time.monotonic_ns()}")
    suffix = pool_id[-6:]
    node_ids: set[str] = set()
    for n in range(NODES):
        body = gpu_node(f"stress-{suffix}-n{n}", GPUS_PER_NODE, cpu=NODE_CPU, memory=NODE_MEMORY)
        node_ids.add((await add_node(admin, pool_id, body))["id"])
    for tenant in TENANTS:
        r = await clients[1].put(f"/v1/tenants/{tenant}/quotas/{pool_id}", json={"limits": QUOTA})
        assert r.status_code == 200, r.text

    load = Workload(clients, pool_id, node_ids)
    start, first_done = asyncio.Barrier(WORKERS), asyncio.Barrier(WORKERS)
    try:
        held_lists = await asyncio.wait_for(
            asyncio.gather(*(_worker(load, w, start, first_done) for w in range(WORKERS))), timeout=180
        )
    except TimeoutError as exc:
        raise AssertionError(
            "the workload did not finish in 180 s (a stuck lock?):\n" + "\n".join(s.output() for s in servers)
        ) from exc
    tally = load.tally
    held = {rid for hs in held_lists for rid in hs}
    summary = (
        f"answers {dict(tally.answers)}; first wave {Counter(tally.first_wave)}; "
        f"pending reasons {dict(tally.pending_reasons)}"
    )
    print(summary)
    server_logs = "\n".join(s.output() for s in servers)
    assert not tally.unexpected, "\n".join(tally.unexpected[:20]) + "\n" + summary + "\n" + server_logs
    assert not [k for k in tally.answers if k.startswith("http 5") or k.startswith("release 5")], summary

    # contention was certain: 32 requests of >= 1 GPU each on 12 GPUs, nothing released meanwhile
    assert len(tally.first_wave) == WORKERS
    assert tally.first_wave_gpus_placed <= NODES * GPUS_PER_NODE
    placed_first = tally.first_wave.count("placed")
    assert placed_first >= 1 and WORKERS - placed_first >= WORKERS - NODES * GPUS_PER_NODE, summary

    # the books with reservations still live
    assert await _violations(engine) == {}, summary
    placed_in_db = set(
        (
            await _scalar(
                engine,
                f"SELECT coalesce(array_agg(id), '{{}}') FROM reservations "
                f"WHERE pool_id = '{pool_id}' AND status = 'placed'",
            )
        )
        or []
    )
    assert placed_in_db == held, "the database's placed reservations are exactly the ones clients hold"
    assert tally.released_ids.isdisjoint(placed_in_db)

    # release everything through both servers at once; then nothing is booked or charged
    await asyncio.gather(*(load.release_twice(rid) for rid in sorted(held)))
    assert not tally.unexpected, "\n".join(tally.unexpected[:20]) + "\n" + server_logs
    assert await _violations(engine) == {}
    assert await _scalar(engine, "SELECT count(*) FROM device_bookings") == 0
    assert await _scalar(engine, "SELECT coalesce(sum(allocated), 0) FROM node_resources") == 0
    assert await _scalar(engine, "SELECT coalesce(sum(used), 0) FROM quota_usage") == 0
    assert await _scalar(engine, "SELECT coalesce(sum(allocated), 0) FROM pool_capacity_rollup") == 0
    assert await _scalar(engine, "SELECT count(*) FROM reservations WHERE status = 'placed'") == 0
    for s in servers:
        assert s.process.poll() is None, f"server {s.port} died:\n{s.output()}"
