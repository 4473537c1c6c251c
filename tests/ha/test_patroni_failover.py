"""A PostgreSQL failover under load that loses nothing (issue 28, done-when 1; docs/scaling.md, "High
availability with Patroni").

etcd and two Patroni-managed PostgreSQL instances with synchronous replication (tests/ha/
patroni_cluster.py); two real service processes on the multi-host URL
``postgresql://postgres@h1:p1,h2:p2/postgres?target_session_attrs=read-write``; 16 asyncio clients
reserve one or two GPUs of a 16-GPU pool, each with its own idempotency key, and release them. A create
answered 503, or whose answer was lost, is ambiguous (it may have committed before the answer was lost)
and is retried with the same key until it answers; every 4th create gives up waiting for its first
answer, as a client whose connection broke would, so some retries surely find a commit. Once the load is
warm, the primary's postmaster is killed (``kill -9``) and Patroni promotes the synchronous standby.
Then:

- every request answered 503 ``UNAVAILABLE`` with ``Retry-After`` or succeeded: no 500, no dropped
  connection, and some 503s came after the kill;
- throughput (creates started after the kill that succeed) is back to half its rate before the kill
  within 30 s;
- every reservation whose create answered 201 or 200 exists on the new primary;
- a retry of every ambiguous create with the same key answers 200 and the same reservation as the answer
  that ended its retries;
- the invariants' SQL sweep (tests/capacity/invariants.py) finds no double booking at any instant and
  the books exact;
- the wake controllers' LISTEN connections followed the primary: with the periodic sweep off, a pending
  reservation is placed when a release frees its GPUs.

The figures (503s seen, seconds to recover, reservations checked, violations) are printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from app.db.engine import create_engine, migrate
from app.db.tables import reservations
from tests.capacity.invariants import violations
from tests.conftest import ADMIN_KEY
from tests.factories import gpu_node, reservation
from tests.ha.patroni_cluster import Member, PatroniCluster, missing, start_cluster
from tests.servers import Server, running_servers

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
CLIENTS = 16
NODES, GPUS = 2, 8
WARM_UP_LIMIT = 20.0  # seconds at most until every client has had a create answered
LOAD_BEFORE = 2.5  # seconds of load, once warm, before the kill: the rate to get back to
LOAD_AFTER = 1.0  # seconds of load once throughput is back
RECOVERY_LIMIT = 30.0  # seconds from the kill until throughput must be back
WINDOW = 2.0  # seconds over which throughput is counted
REQUEST_TIMEOUT = 30.0
ABANDON_EVERY = 4  # every 4th create of a client gives up waiting for its first answer ...
ABANDON_AFTER = 0.001  # ... after this many seconds (no create answers so soon), and retries
RETRY_PAUSE = 0.3  # seconds a client waits before retrying an ambiguous create (Retry-After says 2)
SERVER_ENV = {"BC_LIFECYCLE_SWEEP": "600"}  # no periodic wake: a pending reservation waits for an edge


@pytest.fixture
def cluster() -> Iterator[PatroniCluster]:
    why = missing()
    if why is not None:
        pytest.skip(f"the Patroni failover test needs Patroni and etcd: {why}")
    started = start_cluster(sync_standby=False)  # the standby is cloned while the service starts
    assert started is not None
    try:
        yield started
    finally:
        started.destroy()


@dataclass
class Tally:
    """What the clients saw."""

    answers: Counter[str] = field(default_factory=Counter)  # status code or transport error -> count
    unexpected: list[str] = field(default_factory=list)
    created: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)  # key -> (id, body)
    ambiguous: set[str] = field(default_factory=set)  # keys whose create was retried after a 503 / error
    retry_found_commit: int = 0  # ambiguous creates whose retry answered 200: the lost answer's commit
    done: list[tuple[float, float]] = field(default_factory=list)  # (sent, answered) of each 200/201
    unavailable_after_kill: int = 0
    killed_at: float = float("inf")
    warm: asyncio.Event = field(default_factory=asyncio.Event)  # set once CLIENTS creates have succeeded

    def note_unavailable(self, response: httpx.Response) -> None:
        """A 503 must be UNAVAILABLE with Retry-After; count those answered after the kill."""
        try:
            code = response.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = None
        if code != "UNAVAILABLE" or int(response.headers.get("Retry-After", "0")) < 1:
            self.unexpected.append(f"503 without UNAVAILABLE / Retry-After: {response.text[:300]}")
        if time.monotonic() >= self.killed_at:
            self.unavailable_after_kill += 1


async def _create(
    client: httpx.AsyncClient, body: dict[str, Any], tally: Tally, deadline: float, abandon_first: bool
) -> str | None:
    """POST the create until it answers (same idempotency key on every retry); its reservation id.
    With ``abandon_first`` the first attempt stops waiting for its answer after ABANDON_AFTER seconds,
    as a client whose connection broke would: the service commits it all the same, so the retry finds
    the reservation (200)."""
    key = body["idempotencyKey"]
    timeout = httpx.Timeout(REQUEST_TIMEOUT, read=ABANDON_AFTER) if abandon_first else REQUEST_TIMEOUT
    while time.monotonic() < deadline:
        sent = time.monotonic()
        try:
            response = await client.post("/v1/reservations", json=body, timeout=timeout)
        except httpx.TransportError as lost:  # the answer is lost: the create may have committed
            abandoned = timeout != REQUEST_TIMEOUT and isinstance(lost, httpx.ReadTimeout)
            tally.answers["abandoned" if abandoned else type(lost).__name__] += 1
            tally.ambiguous.add(key)
            timeout = REQUEST_TIMEOUT
            await asyncio.sleep(RETRY_PAUSE)
            continue
        timeout = REQUEST_TIMEOUT
        tally.answers[str(response.status_code)] += 1
        if response.status_code == 503:
            tally.note_unavailable(response)
            tally.ambiguous.add(key)
            await asyncio.sleep(RETRY_PAUSE)
            continue
        if response.status_code not in (200, 201):
            tally.unexpected.append(f"create {key}: {response.status_code} {response.text[:300]}")
            return None
        if response.status_code == 200 and key in tally.ambiguous:
            tally.retry_found_commit += 1
        tally.created[key] = (response.json()["id"], body)
        tally.done.append((sent, time.monotonic()))
        if len(tally.done) >= CLIENTS:
            tally.warm.set()
        return str(response.json()["id"])
    tally.unexpected.append(f"create {key}: no answer before the deadline")
    return None


async def _release(client: httpx.AsyncClient, reservation_id: str, tally: Tally, deadline: float) -> None:
    """POST the release until it answers (releasing twice answers the released reservation)."""
    while time.monotonic() < deadline:
        try:
            response = await client.post(f"/v1/reservations/{reservation_id}/release")
        except httpx.TransportError as lost:
            tally.answers[type(lost).__name__] += 1
            await asyncio.sleep(RETRY_PAUSE)
            continue
        tally.answers[str(response.status_code)] += 1
        if response.status_code == 503:
            tally.note_unavailable(response)
            await asyncio.sleep(RETRY_PAUSE)
            continue
        if response.status_code != 200:
            tally.unexpected.append(f"release {reservation_id}: {response.status_code} {response.text[:300]}")
        return
    tally.unexpected.append(f"release {reservation_id}: no answer before the deadline")


async def _client_loop(
    index: int, server: Server, pool: str, tally: Tally, stop: asyncio.Event, deadline: float
) -> None:
    """Reserve one or two GPUs, hold them a moment, release; until ``stop``."""
    rng = random.Random(index)
    async with httpx.AsyncClient(base_url=server.url, headers=ADMIN, timeout=REQUEST_TIMEOUT) as client:
        step = 0
        while not stop.is_set():
            step += 1
            body = reservation(pool, rng.choice((1, 2)), key=f"failover-{index}-{step}")
            reservation_id = await _create(client, body, tally, deadline, (step + index) % ABANDON_EVERY == 0)
            if reservation_id is None:
                continue
            await asyncio.sleep(rng.uniform(0, 0.05))
            await _release(client, reservation_id, tally, deadline)


def _recovered_after(tally: Tally, wanted: float) -> float | None:
    """Seconds from the kill to the end of the first WINDOW in which creates sent after the kill
    succeeded at ``wanted`` per second or more; None while none has."""
    answered = sorted(a for sent, a in tally.done if sent >= tally.killed_at)
    for i, end in enumerate(answered):
        within = sum(1 for a in answered[: i + 1] if a > end - WINDOW)
        if within >= wanted * WINDOW:
            return end - tally.killed_at
    return None


async def _load(
    cluster: PatroniCluster, leader: Member, servers: list[Server], pool: str
) -> tuple[Tally, dict[str, float]]:
    """16 clients across the servers; once warm, their rate is measured for LOAD_BEFORE seconds and
    the leader's postmaster killed; the load runs until throughput is back (or RECOVERY_LIMIT passed)
    and LOAD_AFTER seconds more."""
    tally, stop = Tally(), asyncio.Event()
    started = time.monotonic()
    deadline = started + WARM_UP_LIMIT + LOAD_BEFORE + RECOVERY_LIMIT + LOAD_AFTER + 60  # bounds retries
    clients = [
        asyncio.create_task(_client_loop(i, servers[i % len(servers)], pool, tally, stop, deadline))
        for i in range(CLIENTS)
    ]
    with contextlib.suppress(TimeoutError):  # a process's first requests are slow: warm up first
        await asyncio.wait_for(tally.warm.wait(), WARM_UP_LIMIT)
    counted_from = time.monotonic()
    await asyncio.sleep(LOAD_BEFORE)
    before = sum(1 for _, answered in tally.done if answered >= counted_from) / (
        time.monotonic() - counted_from
    )
    cluster.kill_postmaster(leader)
    tally.killed_at = time.monotonic()
    recovered, promoted = None, None
    while time.monotonic() < tally.killed_at + RECOVERY_LIMIT:
        await asyncio.sleep(0.2)
        recovered = _recovered_after(tally, before / 2)
        if promoted is None and await asyncio.to_thread(_other_leads, cluster, leader):
            promoted = time.monotonic() - tally.killed_at
        if recovered is not None and promoted is not None:
            break
    await asyncio.sleep(LOAD_AFTER)
    stop.set()
    await asyncio.gather(*clients)
    first = min((a for sent, a in tally.done if sent >= tally.killed_at), default=float("nan"))
    figures = {
        "rate_before_per_s": round(before, 1),
        "first_success_after_kill_s": round(first - tally.killed_at, 2),
        "recovered_s": round(recovered, 2) if recovered is not None else float("inf"),
        "standby_promoted_s": round(promoted, 2) if promoted is not None else float("inf"),
    }
    return tally, figures


def _other_leads(cluster: PatroniCluster, killed: Member) -> bool:
    """Patroni names another member than ``killed`` leader, and it accepts writes."""
    leader = cluster.leader()
    return leader is not None and leader is not killed and leader.rest("/primary") is not None


def _setup(base: str) -> str:
    """A pool of NODES x GPUS GPUs and a quota for tenant acme; the pool's id."""
    pool = httpx.post(f"{base}/v1/pools", json={"name": "failover"}, headers=ADMIN, timeout=30).json()["id"]
    for n in range(NODES):
        added = httpx.post(
            f"{base}/v1/pools/{pool}/nodes", json=gpu_node(f"f{n}", GPUS), headers=ADMIN, timeout=30
        )
        assert added.status_code == 201, added.text
    quota = {"limits": {"gpu": 10 * NODES * GPUS}}
    assert httpx.put(
        f"{base}/v1/tenants/acme/quotas/{pool}", json=quota, headers=ADMIN, timeout=30
    ).is_success
    return pool


async def _retries_answer_the_same(servers: list[Server], tally: Tally) -> list[str]:
    """Retry every ambiguous create once more, alternating the servers: each must answer 200 with the
    reservation its first answer named; the mismatches."""

    async def retry(client: httpx.AsyncClient, key: str) -> str | None:
        reservation_id, body = tally.created[key]
        again = await client.post("/v1/reservations", json=body)
        if again.status_code == 200 and again.json()["id"] == reservation_id:
            return None
        return f"{key}: {again.status_code} {again.text[:200]} (first answer {reservation_id})"

    clients = [httpx.AsyncClient(base_url=s.url, headers=ADMIN, timeout=REQUEST_TIMEOUT) for s in servers]
    try:
        keys = sorted(key for key in tally.ambiguous if key in tally.created)
        found = await asyncio.gather(*(retry(clients[n % len(clients)], key) for n, key in enumerate(keys)))
    finally:
        for client in clients:
            await client.aclose()
    return [wrong for wrong in found if wrong is not None]


def _pending_is_woken(servers: list[Server], pool: str) -> float:
    """Fill the pool with whole-node creates, queue one more (pending), release a fill through the
    other server: seconds until the pending one is placed. The periodic sweep is off, so the wake came
    over a LISTEN connection to the new primary (or from the sweep a listener runs when it connects
    again): either way the controllers followed the primary."""
    fills = []
    for n in range(NODES):
        body = reservation(pool, GPUS, key=f"fill-{n}")
        made = httpx.post(f"{servers[0].url}/v1/reservations", json=body, headers=ADMIN, timeout=30)
        assert made.status_code == 201 and made.json()["status"] == "placed", made.text
        fills.append(made.json()["id"])
    waiting = httpx.post(
        f"{servers[0].url}/v1/reservations",
        json=reservation(pool, GPUS, key="fill-waiting"),
        headers=ADMIN,
        timeout=30,
    )
    assert waiting.status_code == 201 and waiting.json()["status"] == "pending", waiting.text
    released = time.monotonic()
    freed = httpx.post(f"{servers[1].url}/v1/reservations/{fills[0]}/release", headers=ADMIN, timeout=30)
    assert freed.status_code == 200, freed.text
    while time.monotonic() < released + 20:
        seen = httpx.get(
            f"{servers[1].url}/v1/reservations/{waiting.json()['id']}", headers=ADMIN, timeout=30
        )
        if seen.json()["status"] == "placed":
            return time.monotonic() - released
        time.sleep(0.1)
    raise AssertionError("the pending reservation was not woken after the failover: " + seen.text[:500])


async def _books(url: str, ids: list[str]) -> tuple[int, dict[str, Any]]:
    """How many of ``ids`` exist, and the invariants' violations, read from the primary."""
    engine = create_engine(url, pool_size=2)
    try:
        async with engine.connect() as conn:
            found = (await conn.execute(select(func.count()).where(reservations.c.id.in_(ids)))).scalar_one()
        return int(found), await violations(engine)
    finally:
        await engine.dispose()


def test_a_primary_killed_under_load_fails_over_without_loss(cluster: PatroniCluster, tmp_path: Path) -> None:
    began = time.monotonic()
    migrate(cluster.url)  # through the multi-host URL: Alembic finds the primary too
    with running_servers(cluster.url, tmp_path, 2, extra_env=SERVER_ENV) as servers:
        pool = _setup(servers[0].url)
        serving = time.monotonic()
        leader = cluster.wait_ready()  # a leader and its streaming sync standby
        synced = time.monotonic()
        tally, figures = asyncio.run(_load(cluster, leader, servers, pool))
        loaded = time.monotonic()
        wrong_retries = asyncio.run(_retries_answer_the_same(servers, tally))
        woken_after = _pending_is_woken(servers, pool)
    ids = [reservation_id for reservation_id, _ in tally.created.values()]
    found, broken = asyncio.run(_books(cluster.url, ids))
    figures |= {
        "answers": dict(tally.answers),
        "unavailable_after_kill": tally.unavailable_after_kill,
        "ambiguous_creates_retried": len(tally.ambiguous),
        "retries_that_found_the_commit": tally.retry_found_commit,
        "reservations_checked": len(ids),
        "reservations_found": found,
        "violations": sum(len(rows) for rows in broken.values()),
        "pending_woken_after_s": round(woken_after, 2),
        "seconds": {
            "migrate_and_serve": round(serving - began, 1),
            "sync_standby": round(synced - serving, 1),
            "load": round(loaded - synced, 1),
            "checks": round(time.monotonic() - loaded, 1),
        },
    }
    print(f"\npatroni failover: {figures}")
    assert tally.unexpected == [], tally.unexpected[:10]
    # no 500 and no lost connection (an abandoned attempt is the client's own doing)
    assert set(tally.answers) <= {"200", "201", "503", "abandoned"}, tally.answers
    assert tally.unavailable_after_kill > 0, figures  # the switch was seen, as 503
    # seen before the RECOVERY_LIMIT wait ran out (inf: not seen): the standby promoted (a failover, not
    # a restart in place) and throughput back
    assert math.isfinite(figures["standby_promoted_s"]) and math.isfinite(figures["recovered_s"]), figures
    assert found == len(ids), figures
    assert tally.ambiguous and wrong_retries == [], wrong_retries[:10]
    assert tally.retry_found_commit > 0, figures  # an answer lost after the commit: the retry found it
    assert broken == {}, broken
