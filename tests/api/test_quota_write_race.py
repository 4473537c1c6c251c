"""Concurrent quota writes for one tenant never answer 5xx (docs/quota.md, "Writing limits"): 8 clients
write one tenant's limits in one pool for about 10 s through two service processes. Before, each write
deleted and re-inserted the rows and the inserts collided on the primary key (34 of 40 answered 500).
The last writer wins whole: each answer is exactly the row set that write asked for, and the rows left at
the end are one writer's whole set, never a mix."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.factories import add_node, gpu_node, make_pool
from tests.servers import Server, admin_clients, running_servers

CLIENTS = 8
SECONDS = 10.0


@pytest.fixture
def servers(database_url: str, clean_db: AsyncEngine, tmp_path: Path) -> Iterator[list[Server]]:
    """Two service processes."""
    with running_servers(database_url, tmp_path, 2) as started:
        yield started


@pytest.fixture
async def clients(servers: list[Server]) -> AsyncIterator[list[httpx.AsyncClient]]:
    """Admin clients of the two processes."""
    async with admin_clients(servers) as made:
        yield made


def _limits_of(writer: int, round_: int) -> dict[str, int]:
    """Writer ``writer``'s set in round ``round_``: different names and amounts per writer, so a mix of
    two writers' rows would show."""
    names = ["gpu", "cpu", "memory"]
    chosen = names[writer % 3 :] + names[: writer % 3]
    return {name: writer * 1000 + round_ for name in chosen[: 1 + writer % 3]}


async def test_concurrent_quota_writes_of_one_tenant_never_5xx(
    clients: list[httpx.AsyncClient], servers: list[Server]
) -> None:
    pool = await make_pool(clients[0])
    await add_node(clients[0], pool, gpu_node("n1", 2))
    path = f"/v1/tenants/acme/quotas/{pool}"
    statuses: dict[int, int] = {}
    written: list[dict[str, int]] = []
    stop_at = time.monotonic() + SECONDS

    async def writer(i: int) -> None:
        client = clients[i % 2]
        round_ = 0
        while time.monotonic() < stop_at:
            limits = _limits_of(i, round_)
            r = await client.put(path, json={"limits": limits})
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code >= 500:
                raise AssertionError(r.text + "\n".join(s.output() for s in servers))
            assert r.status_code == 200, r.text
            assert r.json()["limits"] == limits  # the answer is the row set this write wrote
            written.append(limits)
            round_ += 1

    await asyncio.gather(*(writer(i) for i in range(CLIENTS)))
    assert set(statuses) == {200}, statuses
    assert len(written) >= CLIENTS * 2  # the writes did overlap: every client wrote more than once
    final = (await clients[1].get(path)).json()["limits"]
    assert final in written  # one writer's whole set, never a mix
