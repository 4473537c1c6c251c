"""Benchmark: one service process under 4 clients posting 50 MB JSON bodies (issue 9, done-when 2).

In one run and one database (``bc_bench_<random>`` on ``DATABASE_URL``'s server, dropped at the end):

1. starts ``better-compute serve`` (1 process), registers a pool with 16 nodes x 8 GPUs;
2. baseline: one client previews a 1-GPU shape back to back for ``--seconds`` and records each latency;
3. under attack: the same preview client while 4 other clients post a 50 MB JSON array of small objects
   in a loop (2 without a key: 401, 2 with a valid key: 413), sampling the process's RSS every 10 ms;
4. prints preview p50 / p99 for both phases and their ratio, attack requests answered and their
   latency, and the RSS growth over idle (the issue's bounds: RSS within 100 MB, preview p99 < 200 ms);
5. without the grant (issue 22): 10 clients at once post a 23 MB node import with a key that holds only
   ``compute:inventory:read`` on the pool, sampling the RSS every 10 ms: the guard refuses them (403)
   before reading the bodies, so the process grows by less than 50 MB (before: 108 -> 445 MB).

    python bench/hostile.py [--seconds 5] [--only-ungranted]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import secrets
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from reserve import admin_exec, pct, start_service
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.db.engine import migrate  # noqa: E402

FIFTY_MB = b"[" + b'{"id": 1, "name": "x"},' * (50 * 1024 * 1024 // 24) + b"{}]"


def rss(pid: int) -> int:
    """Resident set size of ``pid`` in bytes (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def preview_for(url: str, headers: dict[str, str], body: dict, seconds: float) -> list[float]:
    """Preview back to back for ``seconds``; the latencies in ms."""
    took: list[float] = []
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            r = client.post("/v1/capacity/preview", json=body)
            took.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 200, r.text
    return took


def attack(url: str, pool: str, headers: dict[str, str], halt: Any, results: Any) -> None:
    """Post the 50 MB body in a loop until ``halt``; put ``[(status, ms)]`` on ``results``."""
    answered: list[tuple[int, float]] = []
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        t0 = time.perf_counter()
        r = client.post(f"/v1/pools/{pool}/nodes", content=FIFTY_MB)
        answered.append((r.status_code, (time.perf_counter() - t0) * 1000))
        results.put("attacking")
        while not halt.is_set():
            t0 = time.perf_counter()
            r = client.post(f"/v1/pools/{pool}/nodes", content=FIFTY_MB)
            answered.append((r.status_code, (time.perf_counter() - t0) * 1000))
    results.put(answered)


TWENTY_THREE_MB = b'{"name": "x", "topo": "' + b"x" * (23 * 1000 * 1000) + b'"}'
UNGRANTED_CLIENTS = 10
UNGRANTED_BOUND_MB = 50


def ungranted_import(url: str, pool: str, key: str, answers: list[str]) -> None:
    """Post the 23 MB import once with ``key``; append the status (or the transport error) to
    ``answers``."""
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as client:
            r = client.post(
                f"/v1/pools/{pool}/nodes/import",
                content=TWENTY_THREE_MB,
                headers={"content-type": "application/json"},
            )
            answers.append(str(r.status_code))
    except httpx.HTTPError as exc:  # the service answered and closed before the whole body was sent
        answers.append(type(exc).__name__)


def ungranted_phase(url: str, pool: str, admin_headers: dict[str, str], pid: int) -> None:
    """Step 5 of the module docstring: prints the statuses and the RSS growth against its bound."""
    minted = httpx.post(
        f"{url}/v1/api-keys",
        json={
            "principal": "reader",
            "grants": [{"action": "compute:inventory:read", "resource": f"pool:{pool}"}],
        },
        headers=admin_headers,
    )
    assert minted.status_code == 201, minted.text
    key = minted.json()["key"]
    answers: list[str] = []
    ungranted_import(url, pool, key, answers)  # warm up the path once
    idle = rss(pid)
    peak = idle
    stop = threading.Event()

    def sampler() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, rss(pid))
            time.sleep(0.01)

    watch = threading.Thread(target=sampler)
    watch.start()
    answers.clear()
    clients = [
        threading.Thread(target=ungranted_import, args=(url, pool, key, answers))
        for _ in range(UNGRANTED_CLIENTS)
    ]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    stop.set()
    watch.join()
    growth = (peak - idle) / 2**20
    counts = {a: answers.count(a) for a in sorted(set(answers))}
    print(f"{UNGRANTED_CLIENTS} x 23 MB imports without the grant: answers {counts}")
    print(f"RSS idle {idle / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB, growth {growth:.1f} MiB", end=" ")
    verdict = "within" if growth < UNGRANTED_BOUND_MB else "OVER"
    print(f"({verdict} the {UNGRANTED_BOUND_MB} MB bound)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--only-ungranted", action="store_true", help="run step 5 only")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    args = parser.parse_args()
    if not args.database_url:
        raise SystemExit("set DATABASE_URL (a PostgreSQL server where a scratch database may be created)")
    name = f"bc_bench_{secrets.token_hex(4)}"
    url = make_url(args.database_url).set(database=name).render_as_string(hide_password=False)
    admin_key = "bench-" + secrets.token_hex(16)
    headers = {"Authorization": f"Bearer {admin_key}"}
    asyncio.run(admin_exec(args.database_url, f'CREATE DATABASE "{name}"'))
    service = None
    try:
        migrate(url)
        service = asyncio.run(start_service(url, admin_key, 1, Path(tempfile.mkdtemp(prefix="bc-bench-"))))
        created = httpx.post(f"{service.url}/v1/pools", json={"name": "hostile"}, headers=headers)
        assert created.status_code == 201, created.text
        pool = created.json()["id"]
        for i in range(16):
            devices = [{"id": f"n{i}-GPU{g}", "class": "gpu"} for g in range(8)]
            node = {"name": f"n{i}", "devices": devices, "resources": {"cpu": {"allocatable": 64}}}
            assert httpx.post(f"{service.url}/v1/pools/{pool}/nodes", json=node, headers=headers).is_success
        body = {"tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": 1}]}
        body |= {"duration": "1h", "idempotencyKey": "bench"}
        if args.only_ungranted:
            ungranted_phase(service.url, pool, headers, service.process.pid)
            return
        preview_for(service.url, headers, body, 1.0)  # warm up
        idle = rss(service.process.pid)
        baseline = preview_for(service.url, headers, body, args.seconds)

        stop = threading.Event()
        peak = idle

        def sampler() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, rss(service.process.pid))
                time.sleep(0.01)

        # attackers in their own processes, so they do not share this process's GIL with the preview client
        ctx = multiprocessing.get_context("spawn")
        halt, results = ctx.Event(), ctx.Queue()
        attackers = [
            ctx.Process(target=attack, args=(service.url, pool, headers if i % 2 else {}, halt, results))
            for i in range(4)
        ]
        watch = threading.Thread(target=sampler)
        watch.start()
        for a in attackers:
            a.start()
        for _ in attackers:  # each has answered its first 50 MB post
            assert results.get(timeout=120) == "attacking"
        attacked = preview_for(service.url, headers, body, args.seconds)
        halt.set()
        attacks: list[tuple[int, float]] = []
        for _ in attackers:
            attacks.extend(results.get(timeout=120))
        for a in attackers:
            a.join()
        stop.set()
        watch.join()
        ungranted_phase(service.url, pool, headers, service.process.pid)
    finally:
        if service is not None:
            service.stop()
        asyncio.run(admin_exec(args.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    statuses = sorted({s for s, _ in attacks})
    for label, took in (("idle", baseline), ("4 x 50 MB", attacked)):
        print(f"preview, {label:10s} n={len(took):5d}", end="  ")
        print(f"p50 {pct(took, 0.5):6.1f} ms  p99 {pct(took, 0.99):6.1f} ms")
    print(f"p99 ratio attacked/idle: {pct(attacked, 0.99) / pct(baseline, 0.99):.2f}")
    times = [ms for _, ms in attacks]
    print(f"50 MB posts answered: {len(attacks)} (statuses {statuses})", end=", ")
    print(f"p50 {pct(times, 0.5):.0f} ms, p99 {pct(times, 0.99):.0f} ms")
    print(f"RSS idle {idle / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB", end=", ")
    print(f"growth {(peak - idle) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
