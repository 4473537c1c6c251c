"""Benchmark: heartbeats per second with 10,000 agents' nodes, and preview latency while they run (issue 14).

In one run and one database:

1. creates ``bc_bench_<random>``, migrates it and bulk-loads a pool of 10,000 nodes x 8 GPUs (the loader
   of ``bench/reserve.py``), then marks every node as an agent's (heartbeat now; interval 3600 s so the
   service's liveness sweep does not mark them lost while the run takes its time: the cost is the same);
2. for each layout, starts the service (``better-compute serve --workers W``; with ``W+A`` a second
   replica of A workers that the agents talk to, users the first) and creates an agent key
   (``compute:nodes:hello`` on the pool), so each request pays the real key lookup;
3. measures preview p50 / p99 idle (sequential requests, 1 GPU + 4 cpu);
4. floods unchanged heartbeats (all 8 devices healthy, the one-statement path) from C concurrent clients
   for S seconds: heartbeats per second, and the service's CPU per heartbeat (from ``/proc``: other work
   on the machine does not inflate it, as it does wall time). The senders use the lean HTTP client of
   ``bench/rawhttp.py`` (about 0.15 ms of CPU per request; httpx spent 2-3 ms, as much as the service,
   on the same two cores), one keep-alive connection each, like agents;
5. runs previews again while heartbeats are paced at ``--paced`` per second: preview p99 under load and its
   ratio to idle (the target: within 2x). Previews are timed from a process of their own (idle and under
   load alike), so the senders' event loop does not delay the preview client's;
6. registers ``--hellos`` new nodes through ``POST /v1/nodes/hello`` (the DGX A100 ``topo -m`` fixture,
   8 clients) into a second pool: Hellos per second (each creates a node with 8 atoms, 28 links, labels);
7. the baseline: the heartbeat's one statement alone, sent by asyncpg at the same concurrency (the floor the
   HTTP path is compared with, as a ratio).

The database is dropped at the end. Everything (PostgreSQL, the service, the clients) shares the machine.

    python bench/heartbeat.py [--nodes 10000] [--seconds 8] [--clients 32] [--layouts 1,2,1+1] [--paced 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import asyncpg
import httpx
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.db.engine import migrate  # noqa: E402
from bench.rawhttp import RawConnection  # noqa: E402
from bench.reserve import (  # noqa: E402
    DEFAULT_URL,
    SHAPES,
    Service,
    admin_exec,
    dsn,
    load_pool,
    pct,
    reservation_body,
    start_service,
)

GPUS = 8
DGX_A100_TOPO = (ROOT / "tests" / "data" / "topo" / "02-dgx-a100-12nic-mlx5-names.txt").read_text()
# the statement app/inventory/hello.py sends for a heartbeat that changes nothing
SQL_QUIET_HEARTBEAT = """
UPDATE nodes SET last_heartbeat_at = now(), agent_error = NULL
 WHERE id = $1 AND agent_interval_seconds IS NOT NULL AND NOT heartbeat_lost AND ready = true
   AND pool_id = ANY($4::text[])
   AND NOT EXISTS (SELECT 1 FROM unnest($2::text[], $3::bool[]) AS r(id, healthy)
                   LEFT JOIN devices d ON d.id = r.id AND d.node_id = $1
                    WHERE d.id IS NULL OR d.healthy <> r.healthy)
RETURNING no_schedule_reasons"""


def devices_of(node_id: str) -> list[str]:
    return [f"GPU-{node_id}-{i}" for i in range(GPUS)]


async def previews(client: httpx.AsyncClient, pool: str, count: int) -> list[float]:
    """``count`` sequential previews (ms), timed in this event loop."""
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        r = await client.post("/v1/capacity/preview", json=reservation_body(pool, "bench", SHAPES[0]))
        times.append((time.perf_counter() - t0) * 1000)
        if r.status_code != 200 or not r.json()["fits"]:
            raise RuntimeError(f"preview failed: {r.status_code} {r.text[:300]}")
    return times


def _timed_previews(url: str, headers: dict[str, str], pool: str, count: int) -> list[float]:
    """``count`` sequential previews (ms) from a process of their own: the heartbeat senders' event loop
    must not delay the preview client's (the senders then share only the CPU, as other clients would)."""

    async def go() -> list[float]:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as client:
            await previews(client, pool, 2)  # this process's connection and imports
            return await previews(client, pool, count)

    return asyncio.run(go())


async def timed_previews(
    executor: ProcessPoolExecutor, url: str, headers: dict[str, str], pool: str, count: int
) -> list[float]:
    """:func:`_timed_previews` in ``executor``'s process."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor, _timed_previews, url, headers, pool, count)


def heartbeat_body(node: str) -> dict:
    """All 8 devices of ``node`` healthy: the one-statement path."""
    return {"devices": [{"id": d, "healthy": True} for d in devices_of(node)]}


def outcome(status: int, answer: bytes) -> str:
    """``unchanged`` for a 200 that only recorded the time, else ``http <status>`` or ``changed``."""
    if status != 200:
        return f"http {status}"
    return "changed" if json.loads(answer)["changed"] else "unchanged"


async def flood(
    connect: Callable[[], RawConnection], node_ids: list[str], clients: int, seconds: float
) -> tuple[float, dict]:
    """Unchanged heartbeats from ``clients`` concurrent clients (one keep-alive connection each, lean
    HTTP: bench/rawhttp.py) for ``seconds``: (per second, outcomes)."""
    end = time.perf_counter() + seconds
    outcomes: dict[str, int] = {}

    async def one(k: int) -> None:
        rng = random.Random(k)
        conn = connect()
        try:
            while time.perf_counter() < end:
                node = rng.choice(node_ids)
                key = outcome(*await conn.post(f"/v1/nodes/{node}/heartbeat", heartbeat_body(node)))
                outcomes[key] = outcomes.get(key, 0) + 1
        finally:
            await conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(clients)))
    return sum(outcomes.values()) / (time.perf_counter() - t0), outcomes


async def paced(
    connect: Callable[[], RawConnection], node_ids: list[str], rate: float, clients: int, stop: asyncio.Event
) -> int:
    """Heartbeats at up to ``rate`` per second (10,000 agents every 10 s send 1,000/s) from ``clients``
    senders, each keeping its share of the pace, until ``stop``; returns how many were answered 200."""
    answered = 0
    period = clients / rate

    async def sender(k: int) -> None:
        nonlocal answered
        rng = random.Random(1000 + k)
        due = time.perf_counter() + rng.random() * period
        conn = connect()
        try:
            while not stop.is_set():
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                due += period
                node = rng.choice(node_ids)
                status, _ = await conn.post(f"/v1/nodes/{node}/heartbeat", heartbeat_body(node))
                answered += status == 200
        finally:
            await conn.close()

    await asyncio.gather(*(sender(k) for k in range(clients)))
    return answered


async def hellos(client: httpx.AsyncClient, pool: str, count: int, clients: int = 8) -> float:
    """``count`` Hellos of new nodes from ``clients`` concurrent agents: Hellos per second."""
    names = iter(range(count))

    async def one() -> None:
        for i in names:
            body = {
                "poolId": pool,
                "name": f"dgx-{i:05d}",
                "topo": DGX_A100_TOPO,
                "capabilities": ["devices.limits"],
            }
            r = await client.post("/v1/nodes/hello", json=body)
            if r.status_code != 200 or not r.json()["created"]:
                raise RuntimeError(f"hello failed: {r.status_code} {r.text[:300]}")

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(clients)))
    return count / (time.perf_counter() - t0)


async def baseline(pg: asyncpg.Pool, pool: str, node_ids: list[str], clients: int, seconds: float) -> float:
    """The quiet heartbeat statement alone by asyncpg: statements per second."""
    end = time.perf_counter() + seconds
    done = 0

    async def one(k: int) -> None:
        nonlocal done
        rng = random.Random(100 + k)
        async with pg.acquire() as conn:
            while time.perf_counter() < end:
                node = rng.choice(node_ids)
                row = await conn.fetchrow(SQL_QUIET_HEARTBEAT, node, devices_of(node), [True] * GPUS, [pool])
                assert row is not None
                done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(clients)))
    return done / (time.perf_counter() - t0)


async def run(args: argparse.Namespace) -> None:
    name = f"bc_bench_{secrets.token_hex(4)}"
    url = make_url(args.database_url).set(database=name).render_as_string(hide_password=False)
    admin_key = "bench-" + secrets.token_hex(16)
    log_dir = Path(tempfile.mkdtemp(prefix="bc-bench-hb-"))
    print(f"database {name}; service logs in {log_dir}", flush=True)
    await admin_exec(args.database_url, f'CREATE DATABASE "{name}"')
    services: list[Service] = []
    timer = ProcessPoolExecutor(max_workers=1)  # the preview client's own process
    pg: asyncpg.Pool | None = None
    rows = []
    try:
        await asyncio.to_thread(migrate, url)
        pg = await asyncpg.create_pool(dsn(url), min_size=2, max_size=args.clients + 2)
        async with pg.acquire() as conn:
            t0 = time.perf_counter()
            pool = await load_pool(conn, "bench-agents", args.nodes)
            await conn.execute(
                "UPDATE nodes SET agent_interval_seconds = 3600, last_heartbeat_at = now() "
                "WHERE pool_id = $1",
                pool,
            )
            await conn.execute("ANALYZE")
            print(f"registered {args.nodes:,} nodes x 8 GPUs in {time.perf_counter() - t0:.1f} s (bulk SQL)")
            node_ids = [r["id"] for r in await conn.fetch("SELECT id FROM nodes WHERE pool_id = $1", pool)]
        base = await baseline(pg, pool, node_ids, args.clients, args.seconds)
        await pg.close()  # free its connections for the service (PostgreSQL's max_connections is shared)
        pg = None
        print(
            f"baseline: the quiet-heartbeat statement alone (asyncpg, {args.clients} clients): {base:,.0f}/s"
        )
        for layout in args.layouts.split(","):
            workers, _, agent_workers = layout.partition("+")
            service = await start_service(url, admin_key, int(workers), log_dir)
            services.append(service)
            # "W+A": the agents talk to a replica of their own (A workers), users to the first (W workers)
            agent_service = service
            if agent_workers:
                agent_service = await start_service(url, admin_key, int(agent_workers), log_dir)
                services.append(agent_service)
            admin = {"Authorization": f"Bearer {admin_key}"}
            async with httpx.AsyncClient(base_url=service.url, headers=admin, timeout=60) as c:
                key = (
                    await c.post(
                        "/v1/api-keys",
                        json={
                            "principal": "agents",
                            "grants": [{"action": "compute:nodes:hello", "resource": f"pool:{pool}"}],
                        },
                    )
                ).json()["key"]
            agent_headers = {"Authorization": f"Bearer {key}"}

            agents = partial(RawConnection, agent_service.url, agent_headers)

            async with httpx.AsyncClient(base_url=service.url, headers=admin, timeout=120) as client:
                warm = 2 * int(workers)
                await asyncio.gather(*(previews(client, pool, 2) for _ in range(warm)))  # warm caches
                idle = await timed_previews(timer, service.url, admin, pool, args.previews)
                cpu0 = agent_service.cpu_seconds()
                rate, outcomes = await flood(agents, node_ids, args.clients, args.seconds)
                cpu_ms = 1000 * (agent_service.cpu_seconds() - cpu0) / max(1, sum(outcomes.values()))
                stop = asyncio.Event()
                pacer = asyncio.create_task(paced(agents, node_ids, args.paced, args.clients, stop))
                t0 = time.perf_counter()
                loaded = await timed_previews(timer, service.url, admin, pool, args.previews)
                stop.set()
                answered = await pacer
                achieved = answered / (time.perf_counter() - t0)
                if args.hellos and layout == args.layouts.split(",")[0]:
                    hello_pool = (await client.post("/v1/pools", json={"name": "bench-hellos"})).json()["id"]
                    hello_rate = await hellos(client, hello_pool, args.hellos)
                    print(f"registered {args.hellos} nodes through Hello: {hello_rate:,.1f}/s", flush=True)
            idle99, loaded99 = pct(idle, 0.99), pct(loaded, 0.99)
            rows.append((layout, rate, cpu_ms, pct(idle, 0.5), idle99, achieved, pct(loaded, 0.5), loaded99))
            print(
                f"layout {layout}: heartbeats {rate:,.0f}/s ({rate / base:.2f} of the statement alone) "
                f"{outcomes}, {cpu_ms:.2f} ms of service CPU each; "
                f"preview idle p50 {pct(idle, 0.5):.1f} ms p99 {idle99:.1f} ms; "
                f"with {achieved:,.0f} heartbeats/s p50 {pct(loaded, 0.5):.1f} ms p99 {loaded99:.1f} ms "
                f"({loaded99 / idle99:.2f}x idle)",
                flush=True,
            )
            for s in (service, agent_service):
                s.stop()
    finally:
        timer.shutdown()
        for s in services:
            s.stop()
        if pg is not None:
            await pg.close()
        await admin_exec(
            args.database_url,
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = '{name}' AND pid <> pg_backend_pid()",
        )
        await admin_exec(args.database_url, f'DROP DATABASE IF EXISTS "{name}"')
    print("\n layout  heartbeats/s  vs statement  CPU each  preview p99 idle  p99 under paced load  ratio")
    for layout, rate, cpu_ms, _, idle99, achieved, _, loaded99 in rows:
        print(
            f"{layout:>7}  {rate:>12,.0f}  {rate / base:>12.2f}  {cpu_ms:>5.2f} ms  {idle99:>13.1f} ms  "
            f"{loaded99:>11.1f} ms @ {achieved:,.0f}/s  {loaded99 / idle99:>5.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument(
        "--layouts",
        default="1,2,1+1",
        help="service layouts: W (one service, W workers, agents and users alike) or W+A (users on W "
        "workers, agents on a replica of their own with A workers)",
    )
    parser.add_argument("--paced", type=float, default=500.0, help="heartbeats/s while previews are timed")
    parser.add_argument("--previews", type=int, default=200)
    parser.add_argument("--hellos", type=int, default=300, help="nodes registered through Hello (0: skip)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
