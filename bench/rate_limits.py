"""Benchmark: what the deployment's rate-limit windows cost a request (issue 28; docs/operating.md,
"Rate limits").

``GET /v1/pools`` with the bootstrap admin key (its principal cached, so the guard looks nothing up)
through the real app called as ASGI, no client or network, one request at a time, on a fresh database
with no pools (one SELECT each): wall time and this process's CPU time per request (the CPU time weighs
the other processes of a busy machine less), median of interleaved runs, for

- ``memory``: each process counts alone (``BC_RATE_LIMIT_STORAGE=memory``, the count before issue 28);
- ``postgresql, leased``: the default, with a limit far above the load (a lease of 1/32 of what is left
  of the window, so about one statement per window);
- ``postgresql, a statement each``: every request takes its hit in its own statement, what a key pays
  within 64 hits of its limit (the lease share forced to one hit).

    python bench/rate_limits.py [--requests 2000] [--rounds 5]
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
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from observability import get_scope  # noqa: E402
from reserve import DEFAULT_URL, admin_exec  # noqa: E402

from app.api import rate_limits  # noqa: E402
from app.db.engine import migrate  # noqa: E402
from app.main import create_app  # noqa: E402
from app.observability.logs import LOGGER  # noqa: E402
from app.settings import Settings  # noqa: E402

KEY = "bench-admin-key-" + "0" * 32
AUTHORIZATION = ((b"authorization", f"Bearer {KEY}".encode()),)
LIMIT = "1000000000/hour"  # far above the load: a key never refused


class Statements:
    """Counts the rate-limit statements ``engine`` sends."""

    def __init__(self, engine: Any) -> None:
        self.count = 0
        event.listen(engine.sync_engine, "before_cursor_execute", self._seen)

    def _seen(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("INSERT INTO rate_limit_counters"):
            self.count += 1


async def us_per_request(app: Any, requests: int) -> tuple[float, float]:
    """Wall and CPU (this process) µs per ``GET /v1/pools`` through ``app`` as ASGI calls."""
    answers: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answers.append(message["status"])

    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(requests):
        await app(get_scope("/v1/pools", AUTHORIZATION), receive, send)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert set(answers) == {200}, set(answers)
    return elapsed / requests * 1e6, cpu / requests * 1e6


async def run(args: argparse.Namespace) -> None:
    """The whole benchmark (see the module docstring)."""
    server_url = args.database_url
    name = f"bc_bench_rates_{secrets.token_hex(4)}"
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    await admin_exec(server_url, f'CREATE DATABASE "{name}"')
    try:
        await asyncio.to_thread(migrate, url)
        common = {"database_url": url, "bootstrap_admin_key": KEY, "rate_limit": LIMIT}
        cases = {"memory": "memory", "leased": "postgresql", "each": "postgresql"}
        apps = {
            case: create_app(Settings(**common, rate_limit_storage=storage), run_migrations=False)
            for case, storage in cases.items()
        }
        devnull = open(os.devnull, "w")  # noqa: ASYNC230 -- the access log's lines, to nowhere
        for handler in logging.getLogger(LOGGER).handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.setStream(devnull)
        async with (
            apps["memory"].router.lifespan_context(apps["memory"]),
            apps["leased"].router.lifespan_context(apps["leased"]),
            apps["each"].router.lifespan_context(apps["each"]),
        ):
            # warm (the key's principal cached, the statements prepared); "leased" takes its lease
            # here, a billion hits an hour: 1/32 of it lasts the whole run. From then on every lease is
            # one hit, so "each" takes one in every request
            for case, app in apps.items():
                if case == "each":
                    rate_limits.LEASE_SHARE = 2**31 - 1  # an int4; every lease 1 hit
                await us_per_request(app, 100)
            counting = {case: Statements(apps[case].state.services.engine) for case in ("leased", "each")}
            runs: dict[str, list[tuple[float, float]]] = {case: [] for case in cases}
            for round_ in range(args.rounds):  # the order turns each round: no case always runs first
                order = list(cases)[round_ % 3 :] + list(cases)[: round_ % 3]
                for case in order:
                    runs[case].append(await us_per_request(apps[case], args.requests))
    finally:
        await admin_exec(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    total = args.rounds * args.requests
    wall = {case: statistics.median(w for w, _ in runs[case]) for case in runs}
    cpu = {case: statistics.median(c for _, c in runs[case]) for case in runs}
    print(f"GET /v1/pools as ASGI calls, µs a request, median of {args.rounds} x {args.requests:,}")
    print(f"  {'':30} {'wall':>7}  {'vs memory':>9}  {'CPU here':>8}  {'vs memory':>9}")
    for case, label in (
        ("memory", "memory (each process alone)"),
        ("leased", "postgresql, leased"),
        ("each", "postgresql, a statement each"),
    ):
        per = f"{counting[case].count / total:.3f} statements/request" if case in counting else ""
        print(
            f"  {label:30} {wall[case]:7.0f}  {wall[case] - wall['memory']:+9.0f}  {cpu[case]:8.0f}  "
            f"{cpu[case] - cpu['memory']:+9.0f}  {per}"
        )


def main() -> None:
    """Parse arguments and run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or DEFAULT_URL)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
