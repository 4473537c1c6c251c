"""Benchmark: the earliest-start preview beside a plain preview (issue 24, Done when 5; docs/lifecycle.md,
"Earliest start").

Calls the service function :func:`app.capacity.reservations.preview.preview` directly on a real
PostgreSQL (``DATABASE_URL``'s server, a fresh ``bc_bench_<random>`` database, migrated, dropped at the
end), not through HTTP: the figure compared is the preview's own work (reads, pipeline, search), the same
in both cases, without the HTTP stack around it.

Pools of 1,000 and 10,000 nodes x 8 GPUs (bench/reserve.py's ``load_pool``: DGX-1 links, NUMA, labels,
cpu, memory), each holding 100,000 bookings of one GPU, one hour each unless said, written as placed
allocations: on every node, GPU 0 is booked from an hour ago until 30 min to 10 h from now (so no node
has 8 GPUs free now), and the rest are future windows from 11 h on, 90 minutes apart, every atom in
turn (so the first day of starts the search reads holds 9,000 of them at 1,000 nodes, all 100,000 at
10,000). Measured,
interleaved so both see the same machine load, ``--repeat`` times each after one warm-up:

- plain: a preview of 4 GPUs x 1 h, which fits now (the shortlist path, no search);
- earliest: a preview of 8 GPUs x 1 h, which fits nowhere now: the pipeline at the requested start, then
  the earliest-start search (the reads of the intervals of the first day of starts, the pure bound, the
  verification plans) answering ``earliest`` at the first node's free instant;
- no-fit preview: the same 8-GPU preview with the search replaced by one that answers nothing at once
  (the module's ``find_earliest`` swapped for the run of that column only): what the preview of a
  request that does not fit cost before this search, so the search's own share shows.

Prints p50 / p99 of each and the ratio earliest / plain (target: p99 within 3x).

Closing note (a run on the 2-core machine, ``--repeat 20``): plain 20 / 69 ms, earliest 138 / 203 ms
(p99 2.9x) at 1,000 nodes; plain 278 / 372 ms, earliest 738 / 927 ms (p99 2.5x) at 10,000, where the
no-fit preview without the search is 320 / 450 ms (it was 941 / 1,237 ms before a request that fits
nowhere was planned on the shortlist's exceptions read instead of a whole-pool read). The target holds
at both sizes (docs/lifecycle.md, "Earliest start", "Cost").

    python bench/earliest.py [--repeat 30] [--bookings 100000] [--sizes 1000,10000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import time
from datetime import datetime
from pathlib import Path

import asyncpg
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.capacity.config import CapacityConfig  # noqa: E402
from app.capacity.planning.earliest import NoWindow, find_earliest  # noqa: E402
from app.capacity.planning.snapshot import PoolCache  # noqa: E402
from app.capacity.reservations import preview as preview_module  # noqa: E402
from app.capacity.reservations.preview import preview  # noqa: E402
from app.db.engine import create_engine, migrate  # noqa: E402
from app.placement.options import SchedulerOptions  # noqa: E402
from app.placement.request import ReservationRequest  # noqa: E402
from bench.reserve import DEFAULT_URL, admin_exec, dsn, load_pool, pct  # noqa: E402


async def load_bookings(conn: asyncpg.Connection, pool_id: str, count: int) -> datetime:
    """``count`` one-GPU allocations with their bookings on the pool (see the module docstring); returns
    the instant the first node frees its GPU 0 (the expected earliest start)."""
    now: datetime = await conn.fetchval("SELECT now()")
    async with conn.transaction():
        await conn.execute(
            """INSERT INTO reservations (id, tenant_id, pool_id, status, spec, spec_hash, idempotency_key)
               VALUES ('res_bench_' || $1, 'other', $1, 'placed', '{}', '-', 'bench-' || $1)""",
            pool_id,
        )
        # node j (0-based, in id order), booking b on the node: b = 0 is GPU 0 now; b >= 1 is GPU b % 8
        # from 11 h on, 90 minutes apart (12 h apart on one atom: never overlapping)
        await conn.execute(
            """WITH n AS (SELECT id, row_number() OVER (ORDER BY id) - 1 AS j, count(*) OVER () AS total
                            FROM nodes WHERE pool_id = $1),
                    k AS (SELECT n.id AS node_id, n.j, b
                            FROM n, generate_series(0, ($2::int / n.total)::int - 1) b)
               INSERT INTO allocations (id, reservation_id, pool_id, node_id, atoms, during)
               SELECT 'alloc_' || k.node_id || '_' || k.b, 'res_bench_' || $1, $1, k.node_id,
                      ARRAY['GPU-' || k.node_id || '-' || (k.b % 8)],
                      CASE WHEN k.b = 0
                           THEN tstzrange($3::timestamptz - interval '1 hour',
                                          $3::timestamptz + interval '30 minutes'
                                            + ((k.j * 7) % 570) * interval '1 minute')
                           ELSE tstzrange($3::timestamptz + interval '11 hours' + k.b * interval '90 minutes',
                                          $3::timestamptz + interval '12 hours'
                                            + k.b * interval '90 minutes')
                      END
                 FROM k""",
            pool_id,
            count,
            now,
        )
        await conn.execute(
            """INSERT INTO device_bookings (device_pk, device_id, pool_id, allocation_id, during)
               SELECT d.pk, d.id, a.pool_id, a.id, a.during
                 FROM allocations a JOIN devices d ON d.id = a.atoms[1] WHERE a.pool_id = $1""",
            pool_id,
        )
    await conn.execute("ANALYZE")
    return await conn.fetchval(
        "SELECT min(upper(during)) FROM device_bookings WHERE pool_id = $1 AND lower(during) < now()", pool_id
    )


async def no_search(*_: object, **__: object) -> NoWindow:
    """The search swapped out, for the no-fit column."""
    return NoWindow("not searched")


def body(pool_id: str, gpus: int) -> ReservationRequest:
    return ReservationRequest.model_validate(
        {
            "tenantId": "bench",
            "poolId": pool_id,
            "devices": [{"class": "gpu", "count": gpus}],
            "duration": "1h",
            "idempotencyKey": f"bench-{secrets.token_hex(4)}",
        }
    )


async def measure(url: str, pool_id: str, expected: datetime, repeat: int) -> dict[str, list[float]]:
    """Interleaved plain and earliest previews (ms), after one warm-up of each (the pool cache load)."""
    engine = create_engine(url, pool_size=2)
    cache, config = PoolCache(), CapacityConfig(SchedulerOptions())
    times: dict[str, list[float]] = {"plain": [], "earliest": [], "no-fit": []}
    try:
        plain = await preview(engine, cache, config, body(pool_id, 4))
        assert plain.fits, plain
        first = await preview(engine, cache, config, body(pool_id, 8))
        assert not first.fits and first.earliest is not None, first
        assert datetime.fromisoformat(first.earliest.start) == expected, (first.earliest, expected)
        for _ in range(repeat):
            for kind, gpus in (("plain", 4), ("earliest", 8)):
                t0 = time.perf_counter()
                await preview(engine, cache, config, body(pool_id, gpus))
                times[kind].append((time.perf_counter() - t0) * 1000)
            preview_module.find_earliest = no_search
            try:
                t0 = time.perf_counter()
                await preview(engine, cache, config, body(pool_id, 8))
                times["no-fit"].append((time.perf_counter() - t0) * 1000)
            finally:
                preview_module.find_earliest = find_earliest
    finally:
        await engine.dispose()
    return times


async def run(args: argparse.Namespace) -> None:
    name = f"bc_bench_{secrets.token_hex(4)}"
    url = make_url(args.database_url).set(database=name).render_as_string(hide_password=False)
    await admin_exec(args.database_url, f'CREATE DATABASE "{name}"')
    print(
        f"database {name}; {args.bookings:,} bookings per pool, {args.repeat} previews of each kind",
        flush=True,
    )
    try:
        await asyncio.to_thread(migrate, url)
        rows = []
        for size in (int(s) for s in args.sizes.split(",")):
            conn = await asyncpg.connect(dsn(url))
            try:
                t0 = time.perf_counter()
                pool_id = await load_pool(conn, f"bench-{size}", size)
                expected = await load_bookings(conn, pool_id, args.bookings)
                print(
                    f"  loaded {size:,} nodes and the bookings in {time.perf_counter() - t0:.1f} s",
                    flush=True,
                )
            finally:
                await conn.close()
            times = await measure(url, pool_id, expected, args.repeat)
            rows.append((size, times))
        print(
            f"\n{'nodes':>7} {'plain p50':>10} {'p99':>8} {'earliest p50':>13} {'p99':>8} "
            f"{'ratio p50':>10} {'p99':>6} {'no-fit p50':>11} {'p99':>8}"
        )
        for size, times in rows:
            p, e, n = times["plain"], times["earliest"], times["no-fit"]
            print(
                f"{size:>7,} {pct(p, 0.5):>8.1f}ms {pct(p, 0.99):>6.1f}ms {pct(e, 0.5):>11.1f}ms "
                f"{pct(e, 0.99):>6.1f}ms {pct(e, 0.5) / pct(p, 0.5):>9.1f}x "
                f"{pct(e, 0.99) / pct(p, 0.99):>5.1f}x {pct(n, 0.5):>9.1f}ms {pct(n, 0.99):>6.1f}ms"
            )
    finally:
        await admin_exec(args.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--bookings", type=int, default=100_000)
    parser.add_argument("--sizes", default="1000,10000")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
