"""Benchmark: repair latency (issue 21, "Repair first"; docs/lifecycle.md): from marking a booked GPU
unhealthy to no live booking left on it, with no backlog and with ``--backlog`` (600) pending
reservations in another pool that the wake task keeps planning.

In one run and one database:

1. creates ``bc_bench_<random>`` on ``DATABASE_URL``'s server, migrates it and starts the service
   (``better-compute serve``, 1 process) with ``BC_LIFECYCLE_SWEEP=1``: the wake task sweeps every pool
   with pending work every second, so with a backlog it is always in the middle of a sweep (each sweep
   plans all of them again, one transaction each);
2. a repair pool: one node of 8 GPUs and one placed 1-GPU reservation; a backlog pool: ``--nodes`` nodes
   of 8 GPUs, each fully booked by one 8-GPU reservation, so the 1-GPU reservations created there stay
   pending (no node fits) and every sweep plans each of them on every node;
3. per case (0 pending, then ``--backlog`` pending), ``--marks`` times: mark the reservation's GPU
   unhealthy (``POST /v1/nodes/{id}/health``; the clock starts before the request is sent), poll the
   database every 5 ms until no live booking is on that GPU (the repair committed: the reservation
   moved to another GPU of the node), then mark the GPU healthy again;
4. prints median and max latency per case and the ratios backlog / none, and how many wakes the
   service ran during each case (``bc_wakes_total``): with a backlog, sweeps ran throughout the marks.

The database is dropped at the end. Everything (PostgreSQL, the service, this client) shares the
machine's cores; the ratios are the figures to compare (the target: within 2x).

    python bench/repair.py [--marks 7] [--backlog 600] [--nodes 10]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.db.engine import migrate  # noqa: E402
from bench.reserve import DEFAULT_URL, admin_exec, dsn, spawn_service  # noqa: E402

GPUS = 8
POLL = 0.005  # seconds between two reads of the broken GPU's live bookings
GIVE_UP = 120.0  # seconds: a repair not seen by then is reported as such, never waited for longer
LIVE_ON = "SELECT count(*) FROM device_bookings WHERE device_id = $1 AND upper(during) > now()"
WAKES = re.compile(r"^bc_wakes_total\{[^}]*\} ([0-9.e+]+)$", re.MULTILINE)


def node_body(name: str) -> dict[str, Any]:
    """A node of 8 NVLinked GPUs ``<name>-GPU<i>``."""
    ids = [f"{name}-GPU{i}" for i in range(GPUS)]
    return {
        "name": name,
        "devices": [
            {"id": atom, "class": "gpu", "attributes": {"gpuProduct": "H100-SXM5-80GB"}} for atom in ids
        ],
        "links": [{"a": a, "b": b, "link": "NV12"} for a, b in itertools.combinations(ids, 2)],
        "resources": {"cpu": {"allocatable": 64}},
    }


def reservation(pool_id: str, gpus: int, key: str) -> dict[str, Any]:
    """A reservation of ``gpus`` GPUs for one day, of tenant ``bench``."""
    return {
        "tenantId": "bench",
        "poolId": pool_id,
        "devices": [{"class": "gpu", "count": gpus}],
        "duration": "1d",
        "idempotencyKey": key,
    }


async def ok(response: httpx.Response, *statuses: int) -> dict[str, Any]:
    """The JSON body of an expected answer; raises with the body otherwise."""
    if response.status_code not in (statuses or (200, 201)):
        raise RuntimeError(
            f"{response.request.method} {response.request.url}: {response.status_code} {response.text}"
        )
    return response.json()


async def wakes(client: httpx.AsyncClient) -> float:
    """The service's ``bc_wakes_total``, all results together."""
    text = (await client.get("/metrics")).text
    return sum(float(v) for v in WAKES.findall(text))


async def marks(
    client: httpx.AsyncClient, pg: asyncpg.Connection, node_id: str, reservation_id: str, count: int
) -> list[float]:
    """``count`` repair latencies (seconds): mark the reservation's GPU unhealthy, wait until nothing is
    booked on it, mark it healthy again."""
    latencies = []
    for _ in range(count):
        view = await ok(await client.get(f"/v1/reservations/{reservation_id}"))
        [atom] = [
            a for alloc in view["allocations"] if alloc.get("releasedAt") is None for a in alloc["atoms"]
        ]
        started = time.perf_counter()
        await ok(
            await client.post(
                f"/v1/nodes/{node_id}/health", json={"devices": [{"id": atom, "healthy": False}]}
            )
        )
        while await pg.fetchval(LIVE_ON, atom):
            if time.perf_counter() - started > GIVE_UP:
                raise RuntimeError(f"{atom}: still booked {GIVE_UP:.0f} s after the mark")
            await asyncio.sleep(POLL)
        latencies.append(time.perf_counter() - started)
        await ok(
            await client.post(
                f"/v1/nodes/{node_id}/health", json={"devices": [{"id": atom, "healthy": True}]}
            )
        )
        await asyncio.sleep(0.3)  # let the health edge's own work settle before the next mark
    return latencies


async def run(args: argparse.Namespace) -> None:
    """The whole benchmark (see the module docstring)."""
    server_url = args.database_url
    name = f"bc_bench_{secrets.token_hex(4)}"
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    admin_key = "bench-" + secrets.token_hex(16)
    log_dir = Path(tempfile.mkdtemp(prefix="bc-bench-"))
    print(f"database {name} on {make_url(server_url).host}; service log in {log_dir}", flush=True)
    await admin_exec(server_url, f'CREATE DATABASE "{name}"')
    service = None
    try:
        await asyncio.to_thread(migrate, url)
        os.environ["BC_LIFECYCLE_SWEEP"] = "1"  # read by the service only (spawn_service copies the env)
        service = spawn_service(url, admin_key, 1, log_dir)
        headers = {"Authorization": f"Bearer {admin_key}"}
        async with httpx.AsyncClient(base_url=service.url, headers=headers, timeout=120) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if (await client.get("/healthz")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or service.process.poll() is not None:
                    raise RuntimeError(service.log.read_text(errors="replace")[-4000:])
                await asyncio.sleep(0.2)
            pg = await asyncpg.connect(dsn(url))
            try:
                await measure(args, client, pg)
            finally:
                await pg.close()
    finally:
        if service is not None:
            service.stop()
        await admin_exec(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def measure(args: argparse.Namespace, client: httpx.AsyncClient, pg: asyncpg.Connection) -> None:
    """Set the pools up and print the two cases (see the module docstring)."""
    repair_pool = (await ok(await client.post("/v1/pools", json={"name": "repair"})))["id"]
    node = await ok(await client.post(f"/v1/pools/{repair_pool}/nodes", json=node_body("fix")))
    placed = await ok(await client.post("/v1/reservations", json=reservation(repair_pool, 1, "repaired")))
    assert placed["status"] == "placed", placed

    backlog_pool = (await ok(await client.post("/v1/pools", json={"name": "backlog"})))["id"]
    for i in range(args.nodes):
        await ok(await client.post(f"/v1/pools/{backlog_pool}/nodes", json=node_body(f"full{i}")))
        full = await ok(
            await client.post("/v1/reservations", json=reservation(backlog_pool, GPUS, f"full-{i}"))
        )
        assert full["status"] == "placed", full

    results: dict[int, list[float]] = {}
    wakes_run: dict[int, float] = {}
    for backlog in (0, args.backlog):
        if backlog:
            for first in range(0, backlog, 200):
                items = [
                    reservation(backlog_pool, 1, f"pending-{i}")
                    for i in range(first, min(first + 200, backlog))
                ]
                answer = await ok(await client.post("/v1/reservations/batch", json={"items": items}))
                assert {item["reservation"]["status"] for item in answer["items"]} == {"pending"}
            await asyncio.sleep(2.0)  # the next sweep (every second) picks the backlog up
        before = await wakes(client)
        results[backlog] = await marks(client, pg, node["id"], placed["id"], args.marks)
        wakes_run[backlog] = await wakes(client) - before
        pending = await pg.fetchval("SELECT count(*) FROM reservations WHERE status = 'pending'")
        median, worst = statistics.median(results[backlog]), max(results[backlog])
        print(
            f"{backlog:>4} pending ({pending} at the end): repair latency median "
            f"{median * 1000:7.1f} ms, max {worst * 1000:7.1f} ms "
            f"over {args.marks} marks; {wakes_run[backlog]:.0f} wakes ran meanwhile",
            flush=True,
        )
    none, busy = results[0], results[args.backlog]
    ratio = statistics.median(busy) / statistics.median(none)
    print(
        f"ratio {args.backlog} pending / none: median {ratio:.2f}x, "
        f"max {max(busy) / max(none):.2f}x (target: within 2x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--marks", type=int, default=7)
    parser.add_argument("--backlog", type=int, default=600)
    parser.add_argument("--nodes", type=int, default=10)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
