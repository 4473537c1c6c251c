"""Benchmark: what observability costs (issue 10 metrics, issue 9 access log), as ratios in one run.

1. The fleet gauges' census (``app/capacity/controllers/census.py``, run when ``/metrics`` is served): on a
database
   with a pool of 10,000 nodes x 8 GPUs (80,000 atoms, half of them booked now) and 100,000
   reservations, the two aggregate statements are timed beside ``SELECT count(*) FROM devices`` (the
   floor of any count over the atoms) in the same run.
2. The access-log middleware: ``GET /healthz`` and a path no route matches, called as ASGI on the real
   app with the middleware and with it removed (interleaved runs, process CPU time, lines written to
   /dev/null), to show its per-request cost beside the rest of the app.

    python bench/observability.py [--nodes 10000] [--reservations 100000] [--requests 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from reserve import DEFAULT_URL, admin_exec, dsn, load_pool  # noqa: E402

from app.capacity.controllers import census  # noqa: E402
from app.db.engine import create_engine, migrate  # noqa: E402
from app.main import create_app  # noqa: E402
from app.observability.logs import LOGGER  # noqa: E402
from app.observability.middleware import AccessLogMiddleware  # noqa: E402
from app.settings import Settings  # noqa: E402


async def book_half(conn: asyncpg.Connection, pool_id: str, reservations: int) -> None:
    """One placed reservation per node holding GPUs 0..3 now, and released ones up to ``reservations``."""
    await conn.execute(
        """INSERT INTO reservations (id, tenant_id, pool_id, status, spec, spec_hash, idempotency_key)
           SELECT 'res_' || n.id, 't' || (right(n.id, 6)::int % 50), $1, 'placed', '{}', '-', n.id
             FROM nodes n WHERE n.pool_id = $1""",
        pool_id,
    )
    await conn.execute(
        """INSERT INTO allocations (id, reservation_id, pool_id, node_id, atoms, during)
           SELECT 'alloc_' || n.id, 'res_' || n.id, $1, n.id, '{}', tstzrange(now() - interval '1 hour',
                  now() + interval '1 day')
             FROM nodes n WHERE n.pool_id = $1""",
        pool_id,
    )
    await conn.execute(
        """INSERT INTO device_bookings (device_pk, device_id, pool_id, allocation_id, during)
           SELECT d.pk, d.id, $1, 'alloc_' || d.node_id, a.during
             FROM devices d JOIN allocations a ON a.id = 'alloc_' || d.node_id
            WHERE d.ordinal < 4 AND a.pool_id = $1""",
        pool_id,
    )
    await conn.execute(
        """INSERT INTO reservations (id, tenant_id, pool_id, status, spec, spec_hash, idempotency_key)
           SELECT 'res_old_' || g, 't' || (g % 50), $1, 'released', '{}', '-', 'old-' || g
             FROM generate_series(1, $2) g""",
        pool_id,
        max(0, reservations - await conn.fetchval("SELECT count(*) FROM reservations")),
    )


async def median_ms(run: Callable[[], Awaitable[Any]], repeat: int) -> float:
    """The median wall time of ``repeat`` runs (after one warm-up), in ms."""
    await run()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        await run()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def get_scope(path: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> dict[str, Any]:
    """A fresh ASGI scope of ``GET path`` from 127.0.0.1, with ``headers`` besides ``host``."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"bench"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("bench", 80),
        "state": {},
    }


async def cpu_us_per_request(app: Any, requests: int, path: str = "/healthz") -> float:
    """CPU time (µs, this process) per ``GET path`` through ``app`` called as ASGI, no client or network:
    process time, so the other processes on the machine weigh less on the figure."""

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        return None

    for _ in range(100):
        await app(get_scope(path), receive, send)
    started = time.process_time()
    for _ in range(requests):
        await app(get_scope(path), receive, send)
    return (time.process_time() - started) / requests * 1e6


async def run(args: argparse.Namespace) -> None:
    """The whole benchmark (see the module docstring)."""
    server_url = args.database_url
    name = f"bc_bench_obs_{secrets.token_hex(4)}"
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    await admin_exec(server_url, f'CREATE DATABASE "{name}"')
    try:
        await asyncio.to_thread(migrate, url)
        conn = await asyncpg.connect(dsn(url))
        try:
            pool_id = await load_pool(conn, "bench-census", args.nodes)
            await book_half(conn, pool_id, args.reservations)
            await conn.execute("ANALYZE")
        finally:
            await conn.close()
        engine = create_engine(url)
        try:
            async with engine.connect() as c:
                floor = await median_ms(
                    lambda: c.exec_driver_sql("SELECT count(*) FROM devices"), args.repeat
                )
                atoms = await median_ms(lambda: census.atom_counts(c), args.repeat)
                reservations = await median_ms(lambda: census.reservation_counts(c), args.repeat)
                states = await census.atom_counts(c)
        finally:
            await engine.dispose()
        booked = states[(pool_id, "gpu", "booked")]
        print(
            f"census on {args.nodes:,} nodes x 8 GPUs ({booked:,} booked), {args.reservations:,} reservations"
        )
        print(f"  SELECT count(*) FROM devices   {floor:8.1f} ms   1.0x")
        print(f"  bc_atoms census                {atoms:8.1f} ms   {atoms / floor:.1f}x")
        print(f"  bc_reservations census         {reservations:8.1f} ms   {reservations / floor:.1f}x")
    finally:
        await admin_exec(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    settings = Settings(database_url=server_url)
    with_log = create_app(settings, run_migrations=False)
    without = create_app(settings, run_migrations=False)
    devnull = open(os.devnull, "w")  # noqa: ASYNC230 -- every line is formatted and written, to nowhere
    for handler in logging.getLogger(LOGGER).handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(devnull)
    without.user_middleware = [m for m in without.user_middleware if m.cls is not AccessLogMiddleware]
    print(f"GET through the app as ASGI calls (no client), CPU µs a request, median of 5 x {args.requests:,}")
    for path in ("/healthz", "/v1/no-such-route"):
        runs = []
        for _ in range(5):
            base = await cpu_us_per_request(without, args.requests, path)
            runs.append((await cpu_us_per_request(with_log, args.requests, path), base))
        logged, base = sorted(runs, key=lambda r: r[0] - r[1])[2]
        print(f"  {path:18} without the access-log middleware {base:6.0f} µs   1.00x")
        print(f"  {path:18} with it (lines to /dev/null)      {logged:6.0f} µs   {logged / base:.2f}x")


def main() -> None:
    """Parse arguments and run the benchmark."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or DEFAULT_URL)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--reservations", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--requests", type=int, default=3000)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
