"""Extends and creates racing for the same atoms' next window, through two service processes
(docs/lifecycle.md, "Extend"): afterwards no atom is double-booked at any instant, every book is exact
(tests/capacity/invariants.py), each extend answered 200 or 409 CONFLICT, each create 201, and at the
contested instant no more reservations hold a GPU than the node has."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.capacity.helpers import overlapping_bookings
from tests.capacity.invariants import violations
from tests.factories import add_node, gpu_node, make_pool, reservation
from tests.servers import Server, admin_clients, running_servers

GPUS = 4
CREATES = 8
ROUNDS = 3


@pytest.fixture(scope="module")
def servers(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    """Two service processes on the test database."""
    with running_servers(database_url, tmp_path_factory.mktemp("extend"), 2) as started:
        yield started


@pytest.fixture
async def clients(servers: list[Server]) -> AsyncIterator[list[httpx.AsyncClient]]:
    async with admin_clients(servers) as made:
        yield made


def _end(view: dict[str, Any]) -> datetime:
    return max(datetime.fromisoformat(a["end"]) for a in view["allocations"])


async def _round(clients: list[httpx.AsyncClient], n: int) -> tuple[int, int]:
    """One pool whose GPUs are all held for an hour; then every holder extends by an hour while
    CREATES reservations ask for a GPU from the latest end on, half through each process. Returns
    (extends that succeeded, creates placed)."""
    a, b = clients
    pool = await make_pool(a)
    await add_node(a, pool, gpu_node(f"racer{n}", GPUS, cpu=None, memory=None))
    holders = []
    for _ in range(GPUS):
        r = await a.post("/v1/reservations", json=reservation(pool, 1, duration="1h"))
        assert r.status_code == 201 and r.json()["status"] == "placed", r.text
        holders.append(r.json())
    contested = max(_end(h) for h in holders)

    async def extend(i: int, holder: dict[str, Any]) -> httpx.Response:
        new_end = _end(holder) + timedelta(hours=1)
        return await clients[i % 2].post(
            f"/v1/reservations/{holder['id']}/extend", json={"end": new_end.isoformat()}
        )

    async def create(i: int) -> httpx.Response:
        body = reservation(pool, 1, start=contested.isoformat(), duration="1h")
        return await clients[(i + 1) % 2].post("/v1/reservations", json=body)

    calls = [extend(i, h) for i, h in enumerate(holders)] + [create(i) for i in range(CREATES)]
    answers = await asyncio.gather(*calls)
    extends, creates = answers[:GPUS], answers[GPUS:]
    for r in extends:
        assert r.status_code in (200, 409), r.text
        if r.status_code == 409:
            assert r.json()["error"]["code"] == "CONFLICT", r.text
    for r in creates:
        assert r.status_code == 201, r.text
        assert r.json()["status"] in ("placed", "pending"), r.text

    extended = 0
    for holder, r in zip(holders, extends, strict=True):
        now = (await a.get(f"/v1/reservations/{holder['id']}")).json()
        if r.status_code == 200:
            extended += 1
            assert _end(now) == _end(holder) + timedelta(hours=1)
        else:  # refused: its window is as it was
            assert _end(now) == _end(holder) and now["conditions"] == holder["conditions"]
    placed = sum(1 for r in creates if r.json()["status"] == "placed")
    assert extended + placed <= GPUS  # at the contested instant each GPU holds one of them at most
    return extended, placed


async def test_extends_and_creates_race_for_the_next_window(
    clients: list[httpx.AsyncClient], clean_db: AsyncEngine
) -> None:
    outcomes = [await _round(clients, n) for n in range(ROUNDS)]
    async with clean_db.connect() as conn:
        assert await overlapping_bookings(conn) == 0
    assert await violations(clean_db) == {}
    assert all(extended + placed <= GPUS for extended, placed in outcomes), outcomes
