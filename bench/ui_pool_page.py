"""Benchmark: the dashboard's pool page of a 1,000-node pool in the browser (docs/dashboard.md).

A fresh ``bc_bench_<random>`` database on ``DATABASE_URL``'s server (dropped at the end), a pool of
``--nodes`` nodes x 8 GPUs with ``--bookings`` one-GPU bookings (bench/reserve.py's ``load_pool`` and
bench/earliest.py's ``load_bookings``), one ``better-compute serve`` process, and Debian's chromium
(``/usr/bin/chromium``) driven by Playwright. Each of ``--repeat`` loads opens
``/ui/#/pools/<poolId>`` in a fresh page (key already in sessionStorage) and stops the clock when every
GPU cell of the grid and the timeline's ``svg`` are there (the rows of a long timeline are drawn by
blocks as they come into view, the rest while the browser is idle). Prints each load and p50 / max,
and the time of the occupancy call alone (``GET /v1/pools/{poolId}/occupancy``, the page's biggest
read). Not a test.

Closing note (the 2-core machine, shared and noisy; defaults but ``--repeat 3``): before, the occupancy
call 1,360 ms (3.1 MB) and the page 2,946 / 4,092 / 2,175 ms (p50 2.9 s), most of it the occupancy read
(its tree validated again before it was written) and drawing 8,000 cells and 10,000 timeline bars at
once. After (the document written without a second validation, the grid's cells cloned, the timeline
drawn by blocks of 50 rows as they come into view, modules preloaded; docs/dashboard.md): the occupancy
call 488 ms (3.1 MB), the page 1,919 / 1,420 / 1,806 ms (p50 1.8 s). The old and the new code side by
side on one database, loads interleaved (6 each, a quieter moment): p50 1,706 -> 1,536 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
import httpx
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.db.engine import migrate  # noqa: E402
from bench.earliest import load_bookings  # noqa: E402
from bench.reserve import DEFAULT_URL, admin_exec, dsn, load_pool, pct, start_service  # noqa: E402

ADMIN_KEY = "bench-admin-key-" + "0" * 32


async def measure(base: str, pool_id: str, gpus: int, repeat: int, chromium: str) -> list[float]:
    from playwright.async_api import async_playwright

    times = []
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        context = await browser.new_context(viewport={"width": 1280, "height": 900})
        await context.add_init_script(f"sessionStorage.setItem('bc.apiKey', {ADMIN_KEY!r})")
        for i in range(repeat + 1):
            page = await context.new_page()
            t0 = time.perf_counter()
            await page.goto(f"{base}/ui/#/pools/{pool_id}")
            await page.locator("[data-atom]").nth(gpus - 1).wait_for(state="attached", timeout=120_000)
            await page.locator("svg.timeline").first.wait_for(state="attached", timeout=120_000)
            elapsed = (time.perf_counter() - t0) * 1000
            await page.close()
            if i:  # the first is a warm-up
                times.append(elapsed)
                print(f"  load {i}: {elapsed:.0f} ms", flush=True)
        await browser.close()
    return times


async def run(args: argparse.Namespace) -> None:
    name = f"bc_bench_{secrets.token_hex(4)}"
    url = make_url(args.database_url).set(database=name).render_as_string(hide_password=False)
    await admin_exec(args.database_url, f'CREATE DATABASE "{name}"')
    service = None
    try:
        await asyncio.to_thread(migrate, url)
        conn = await asyncpg.connect(dsn(url))
        try:
            pool_id = await load_pool(conn, "bench-ui", args.nodes)
            await load_bookings(conn, pool_id, args.bookings)
        finally:
            await conn.close()
        service = await start_service(url, ADMIN_KEY, 1, Path(tempfile.mkdtemp(prefix="bc-bench-ui-")))
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=120) as client:
            t0 = time.perf_counter()
            r = await client.get(f"{service.url}/v1/pools/{pool_id}/occupancy")
            r.raise_for_status()
            print(
                f"occupancy call: {(time.perf_counter() - t0) * 1000:.0f} ms, {len(r.content) / 1e6:.1f} MB",
                flush=True,
            )
        times = await measure(service.url, pool_id, args.nodes * 8, args.repeat, args.chromium)
        print(
            f"pool page, {args.nodes:,} nodes x 8 GPUs: p50 {pct(times, 0.5):.0f} ms, max {max(times):.0f} ms"
        )
    finally:
        if service is not None:
            service.stop()
        await admin_exec(args.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--bookings", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
