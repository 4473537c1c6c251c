"""Stress: two real service processes, 32 concurrent clients, one small pool (issue 4, "Done when" 1;
issue 11, "Races").

Two ``python -m app.cli serve`` processes share the test database. 32 ``httpx.AsyncClient`` workers,
spread over 8 tenants with quotas, reserve mixed shapes (1, 2 or 4 GPUs, some with cpu and memory, some
cpu alone) and release them, alternating between the servers, on a pool of 3 nodes x 4 GPUs, so most
requests collide on the same nodes and atoms. Some steps race on purpose: one reservation released
through both servers at once, one idempotency key created through both servers at once.

After the first wave, most requests ask for random overlapping windows in the next few hours (GPUs and
cpu, some cpu alone), and releases cut them mid-window or remove them before they start.

The first wave is synchronized: all 32 workers reserve at once and nobody releases until every answer
is in. The wave asks for at least 32 GPUs of a 12-GPU pool, so at most 12 of its requests can be placed
and the rest must answer pending (or QUOTA_EXCEEDED): contention is certain, not hoped for.

Afterwards SQL checks the books with reservations still live, and again after everything is released:
no device has overlapping bookings; a sweep over every holding boundary finds no instant at which a
node's held cpu (or memory) exceeds ``floor(allocatable x ratio)`` nor one at which a tenant's usage
exceeds its limit; every allocation's scalar holdings and every reservation's quota holdings are what it
asked for over its window (cut at the release instant when released); every placed reservation's atoms
equal its bookings; nothing released holds anything after its release; a whole-node lease (a tenth of
the later one-member requests) holds its node alone in its window; no reservation is placed twice (the
shared sweep, tests/capacity/invariants.py). No answer may be a 5xx.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.capacity.invariants import counts, violations
from tests.factories import add_node, gpu_node, make_pool
from tests.servers import Server, admin_clients, running_servers

pytestmark = pytest.mark.slow  # a long module: it starts early in a parallel run (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]
SERVERS = 2
WORKERS = 32
ROUNDS = 10  # steps per worker after the synchronized first wave
NODES = 3
GPUS_PER_NODE = 4
NODE_CPU = 12
NODE_MEMORY = 64_000
NODE_ROOM = {"cpu": NODE_CPU, "memory": NODE_MEMORY}  # what a lease holds of a node
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
LEASE_SHARE = 0.15  # of the one-member requests, whole-node leases (binding: node) of 1 GPU
WINDOW_SHARE = 0.6  # later requests with a random window in the next few hours (the others: now, 1 day)
SLOT = timedelta(minutes=20)  # windows start on a slot of the next 4 hours and last 1 to 6 slots
# a third of the windows (and every lease's) lie a day later, after the 1-day requests: there leases find
# empty nodes and race the other windowed work for them
LATER = timedelta(days=1, hours=1)
LATER_SHARE = 0.3
STARTUP_SECONDS = 60.0
FLIP_SECONDS = 0.05  # while the workload runs, a GPU is marked unhealthy, healed this long after, and so on
SETTLE_SECONDS = 20.0  # the most BookingRepair may take to move work off the GPU left broken at the end
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
    pending_ids: set[str] = field(default_factory=set)  # answered pending: a wake may place them later

    def bad(self, what: str, response: httpx.Response) -> None:
        """Record an answer the test does not accept."""
        self.unexpected.append(f"{what}: {response.status_code} {response.text[:500]}")


def _body(
    pool_id: str,
    tenant: str,
    key: str,
    shape: tuple[int, dict[str, int]],
    members: int = 1,
    start: datetime | None = None,
    seconds: int | None = None,
) -> dict[str, Any]:
    gpus, resources = shape
    body: dict[str, Any] = {
        "tenantId": tenant,
        "poolId": pool_id,
        "devices": [{"class": "gpu", "count": gpus}] if gpus else [],
        "duration": seconds if seconds is not None else "1d",
        "idempotencyKey": key,
    }
    if start is not None:
        body["start"] = start.isoformat()
    if resources:
        body["resources"] = resources
    if members > 1:
        body["gang"] = {"members": members}
    return body


def _same_instant(a: str, b: str) -> bool:
    return datetime.fromisoformat(a) == datetime.fromisoformat(b)


class Workload:
    """The clients' side: reserve / release helpers that check every answer's shape."""

    def __init__(
        self, clients: list[httpx.AsyncClient], pool_id: str, node_ids: set[str], base: datetime
    ) -> None:
        self.clients = clients
        self.pool_id = pool_id
        self.node_ids = node_ids
        self.base = base  # windows start after this instant (the database clock at the start)
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
        lease = body.get("binding") == "node"
        if status == "placed":
            allocs = view["allocations"]
            # a whole-node lease takes every available atom and all scalar room of its node
            resources = NODE_ROOM if lease else body.get("resources", {})
            ok = (
                len(allocs) == members
                and len({a["nodeId"] for a in allocs}) == members  # a gang's members on distinct nodes
                and all(
                    (len(a["atoms"]) >= gpus if lease else len(a["atoms"]) == gpus)
                    and len(set(a["atoms"])) == len(a["atoms"])
                    and a["nodeId"] in self.node_ids
                    and {k: float(v) for k, v in a["resources"].items()}
                    == {k: float(v) for k, v in resources.items()}
                    and (
                        "start" not in body
                        or datetime.fromisoformat(a["start"]) == datetime.fromisoformat(body["start"])
                    )
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
            self.tally.pending_ids.add(view["id"])
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
        lease = members == 1 and rng.random() < LEASE_SHARE
        start, seconds = None, None
        if lease or rng.random() < WINDOW_SHARE:
            later = lease or rng.random() < LATER_SHARE
            start = load.base + (LATER if later else timedelta(0)) + rng.randrange(12) * SLOT
            seconds = int((rng.randint(1, 6) * SLOT).total_seconds())
        shape = (1, {}) if lease else rng.choice(SHAPES)
        body = _body(load.pool_id, tenant, load.key(worker), shape, members, start, seconds)
        if lease:
            body["binding"] = "node"
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


async def _scalar(engine: AsyncEngine, sql: str) -> Any:
    async with engine.connect() as conn:
        return (await conn.exec_driver_sql(sql)).scalar_one()


async def _flip_health(load: Workload, atoms: list[tuple[str, str]], stop: asyncio.Event) -> int:
    """Mark a random GPU unhealthy, heal it ``FLIP_SECONDS`` later, and again, alternating between the
    servers, until ``stop``: BookingRepair moves work off it meanwhile and leases placed while it is
    broken hold it. Returns the number of flips."""
    rng = random.Random(104729)
    flips = 0
    while not stop.is_set():
        node_id, atom = rng.choice(atoms)
        for healthy in (False, True):
            await _set_health(load, flips % len(load.clients), node_id, atom, healthy)
            await asyncio.sleep(FLIP_SECONDS)
        flips += 1
    return flips


async def _set_health(load: Workload, server: int, node_id: str, atom: str, healthy: bool) -> None:
    body = {"devices": [{"id": atom, "healthy": healthy}]}
    r = await load.clients[server].post(f"/v1/nodes/{node_id}/health", json=body)
    load.tally.answers[f"health {r.status_code}"] += 1
    if r.status_code != 200:
        load.tally.bad(f"health {atom} {healthy}", r)


# ------------------------------------------------------------------------------------------ the test


@pytest.fixture
async def clients(servers: list[Server]) -> AsyncIterator[list[httpx.AsyncClient]]:
    """One admin ``httpx.AsyncClient`` per server."""
    async with admin_clients(servers, REQUEST_TIMEOUT, 2 * WORKERS) as made:
        yield made


async def test_two_servers_32_clients_never_double_book(
    servers: list[Server], clients: list[httpx.AsyncClient], engine: AsyncEngine
) -> None:
    """32 clients reserve and release through 2 processes; SQL finds the books exact, twice."""
    assert len(servers) >= 2 and len({s.process.pid for s in servers}) == len(servers)
    admin = clients[0]
    pool_id = await make_pool(admin, f"stress-{os.getpid()}-{time.monotonic_ns()}")
    suffix = pool_id[-6:]
    node_ids: set[str] = set()
    gpus: list[tuple[str, str]] = []  # (node id, atom)
    for n in range(NODES):
        body = gpu_node(f"stress-{suffix}-n{n}", GPUS_PER_NODE, cpu=NODE_CPU, memory=NODE_MEMORY)
        node_id = (await add_node(admin, pool_id, body))["id"]
        node_ids.add(node_id)
        gpus += [(node_id, d["id"]) for d in body["devices"]]
    for tenant in TENANTS:
        r = await clients[1].put(f"/v1/tenants/{tenant}/quotas/{pool_id}", json={"limits": QUOTA})
        assert r.status_code == 200, r.text

    base = await _scalar(engine, "SELECT now() + interval '1 minute'")
    load = Workload(clients, pool_id, node_ids, base)
    start, first_done = asyncio.Barrier(WORKERS), asyncio.Barrier(WORKERS)
    stop = asyncio.Event()
    flipper = asyncio.create_task(_flip_health(load, gpus, stop))
    try:
        held_lists = await asyncio.wait_for(
            asyncio.gather(*(_worker(load, w, start, first_done) for w in range(WORKERS))), timeout=180
        )
    except TimeoutError as exc:
        raise AssertionError(
            "the workload did not finish in 180 s (a stuck lock?):\n" + "\n".join(s.output() for s in servers)
        ) from exc
    finally:
        stop.set()
        flips = await flipper
    # one GPU stays broken; BookingRepair settles: nothing is in use on it (the sweep checks it)
    broken_node, broken_atom = gpus[0]
    await _set_health(load, 1, broken_node, broken_atom, healthy=False)
    settled = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < settled:
        if "in use on an unavailable atom" not in await violations(engine):
            break
        await asyncio.sleep(0.1)
    tally = load.tally
    held = {rid for hs in held_lists for rid in hs}
    summary = (
        f"answers {dict(tally.answers)}; first wave {Counter(tally.first_wave)}; "
        f"pending reasons {dict(tally.pending_reasons)}"
    )
    print(f"{summary}; health flips {flips}")
    server_logs = "\n".join(s.output() for s in servers)
    assert not tally.unexpected, "\n".join(tally.unexpected[:20]) + "\n" + summary + "\n" + server_logs
    assert not [k for k in tally.answers if k.startswith("http 5") or k.startswith("release 5")], summary

    # contention was certain: 32 requests of >= 1 GPU each on 12 GPUs, nothing released meanwhile
    assert len(tally.first_wave) == WORKERS
    assert tally.first_wave_gpus_placed <= NODES * GPUS_PER_NODE
    placed_first = tally.first_wave.count("placed")
    assert placed_first >= 1 and WORKERS - placed_first >= WORKERS - NODES * GPUS_PER_NODE, summary

    # the books with reservations still live
    leases = await _scalar(
        engine,
        "SELECT count(*) FROM allocations a JOIN reservations r ON r.id = a.reservation_id "
        "WHERE r.spec->>'binding' = 'node'",
    )
    holding = await _scalar(  # leases placed beside a broken GPU: they book it without using it
        engine,
        "SELECT count(DISTINCT a.id) FROM allocations a JOIN device_bookings b ON b.allocation_id = a.id "
        "WHERE b.device_id <> ALL(a.atoms)",
    )
    print(f"lease allocations {leases} ({holding} holding an unused GPU); invariants {await counts(engine)}")
    assert await violations(engine) == {}, summary
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
    repaired = set(
        await _scalar(
            engine,
            "SELECT coalesce(array_agg(id), '{}') FROM reservations "
            """WHERE conditions @> '[{"type": "Repaired"}]'""",
        )
        or []
    )
    print(f"repaired reservations {len(repaired)}")
    # the database's placed reservations are the ones clients hold (but those a repair left pending),
    # plus pending ones a wake placed
    assert held - placed_in_db <= repaired and placed_in_db - held <= tally.pending_ids | repaired, summary
    assert tally.released_ids.isdisjoint(placed_in_db)

    # release everything through both servers at once, the pending ones too (no wake may place them
    # after the last release); then nothing is booked or charged
    everything = held | placed_in_db | tally.pending_ids
    await asyncio.gather(*(load.release_twice(rid) for rid in sorted(everything)))
    assert not tally.unexpected, "\n".join(tally.unexpected[:20]) + "\n" + server_logs
    print(f"after the last release: invariants (offending rows) {await counts(engine)}")
    assert await violations(engine) == {}
    # nothing is booked or held after the last release instant (what was used stays as history)
    assert await _scalar(engine, "SELECT count(*) FROM device_bookings WHERE upper(during) > now()") == 0
    assert await _scalar(engine, "SELECT count(*) FROM scalar_holdings WHERE ends_at > now()") == 0
    assert await _scalar(engine, "SELECT count(*) FROM quota_holdings WHERE ends_at > now()") == 0
    assert await _scalar(engine, "SELECT count(*) FROM reservations WHERE status = 'placed'") == 0
    for s in servers:
        assert s.process.poll() is None, f"server {s.port} died:\n{s.output()}"
