"""Benchmark: what the rejection rows and nearest misses cost a preview that does not fit (issue 25, Done
when 5; docs/reasons.md, "Rejection rows" and "Nearest misses").

Calls the service function :func:`app.capacity.reservations.preview.preview` directly on a real
PostgreSQL (``DATABASE_URL``'s server, a fresh ``bc_bench_<random>`` database, dropped at the end), on the
pools of ``bench/earliest.py`` (1,000 and 10,000 nodes x 8 GPUs, 100,000 bookings each, GPU 0 of every node
busy now). Measured interleaved, ``--repeat`` times each after one warm-up, so both see the same load:

- with: a preview of 8 GPUs x 1 h, which fits nowhere now, as the service answers it (rows and misses);
- without: the same preview with the rows and misses left out (``PlanOutcome.why_not`` answering None for
  that column's runs only): the preview as it was before them.

The earliest-start search is left out of both (it is the same in both and measured by
``bench/earliest.py``). Prints p50 / p99 of each and the ratio with / without (target: p99 within 1.5x).

Closing note (a run on the 2-core machine shared with a test run, ``--repeat 20``): with / without, p50
and p99: 42.6 / 46.9 ms against 38.3 / 95.9 ms at 1,000 nodes (1.11x, 0.49x: the p99 is noise), 420.5 /
513.0 ms against 352.9 / 457.7 ms at 10,000 (1.19x, 1.12x). Before this batch the same no-fit preview
took 941 / 1,237 ms at 10,000 nodes (a whole-pool read; docs/lifecycle.md, "Earliest start", "Cost").

    python bench/why_not.py [--repeat 20] [--bookings 100000] [--sizes 1000,10000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.capacity.config import CapacityConfig  # noqa: E402
from app.capacity.planning.earliest import find_earliest  # noqa: E402
from app.capacity.planning.plan import PlanOutcome  # noqa: E402
from app.capacity.planning.snapshot import PoolCache  # noqa: E402
from app.capacity.reservations import preview as preview_module  # noqa: E402
from app.capacity.reservations.preview import preview  # noqa: E402
from app.db.engine import create_engine, migrate  # noqa: E402
from app.placement.options import SchedulerOptions  # noqa: E402
from bench.earliest import body, load_bookings, no_search  # noqa: E402
from bench.reserve import DEFAULT_URL, admin_exec, dsn, load_pool, pct  # noqa: E402

WITH_WHY = PlanOutcome.why_not


def without_why(self: PlanOutcome, *_: Any) -> None:
    """``PlanOutcome.why_not`` swapped out, for the "without" column."""
    return None


async def measure(url: str, pool_id: str, size: int, repeat: int) -> dict[str, list[float]]:
    engine = create_engine(url, pool_size=2)
    cache, config = PoolCache(), CapacityConfig(SchedulerOptions())
    times: dict[str, list[float]] = {"with": [], "without": []}
    preview_module.find_earliest = no_search
    try:
        answer = await preview(engine, cache, config, body(pool_id, 8))
        assert not answer.fits and answer.rejections and answer.nearestMisses, answer
        assert sum(r.count for r in answer.rejections) == size, answer.rejections
        for _ in range(repeat):
            for kind in ("with", "without"):
                PlanOutcome.why_not = WITH_WHY if kind == "with" else without_why  # type: ignore[method-assign]
                try:
                    t0 = time.perf_counter()
                    await preview(engine, cache, config, body(pool_id, 8))
                    times[kind].append((time.perf_counter() - t0) * 1000)
                finally:
                    PlanOutcome.why_not = WITH_WHY  # type: ignore[method-assign]
    finally:
        preview_module.find_earliest = find_earliest
        await engine.dispose()
    return times


async def run(args: argparse.Namespace) -> None:
    name = f"bc_bench_{secrets.token_hex(4)}"
    url = make_url(args.database_url).set(database=name).render_as_string(hide_password=False)
    await admin_exec(args.database_url, f'CREATE DATABASE "{name}"')
    print(f"database {name}; {args.bookings:,} bookings per pool, {args.repeat} previews of each", flush=True)
    try:
        await asyncio.to_thread(migrate, url)
        rows = []
        for size in (int(s) for s in args.sizes.split(",")):
            conn = await asyncpg.connect(dsn(url))
            try:
                pool_id = await load_pool(conn, f"bench-{size}", size)
                await load_bookings(conn, pool_id, args.bookings)
            finally:
                await conn.close()
            rows.append((size, await measure(url, pool_id, size, args.repeat)))
        print(
            f"\n{'nodes':>7} {'with p50':>9} {'p99':>8} {'without p50':>12} {'p99':>8} "
            f"{'ratio p50':>10} {'p99':>6}"
        )
        for size, times in rows:
            w, o = times["with"], times["without"]
            print(
                f"{size:>7,} {pct(w, 0.5):>7.1f}ms {pct(w, 0.99):>6.1f}ms {pct(o, 0.5):>10.1f}ms "
                f"{pct(o, 0.99):>6.1f}ms {pct(w, 0.5) / pct(o, 0.5):>9.2f}x "
                f"{pct(w, 0.99) / pct(o, 0.99):>5.2f}x"
            )
    finally:
        await admin_exec(args.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--bookings", type=int, default=100_000)
    parser.add_argument("--sizes", default="1000,10000")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
