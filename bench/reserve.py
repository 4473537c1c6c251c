"""Benchmark: reserve throughput of the service beside the guarded-commit ceiling (issue 4, done-when 4).

In one run and one database:

1. creates ``bc_bench_<random>`` on ``DATABASE_URL``'s server, migrates it, and loads a pool of 1,000
   nodes x 8 GPUs (and, for the preview, one of 10,000 nodes) with bulk ``INSERT ... SELECT`` statements:
   devices, DGX-1 hybrid-cube-mesh links (NV / SYS), NUMA nodes, labels, cpu and memory;
2. starts the service (``better-compute serve``, 1 process, then ``--workers 2``) and, for N concurrent
   HTTP clients in (1, 4, 16), reserves 1-GPU (+4 cpu) and 8-GPU (+32 cpu) shapes for a few seconds each,
   one tenant per client (quota rows are per tenant; a final row shows 16 clients of one tenant), and
   prints placements per second with p50 / p99 reserve latency. Between cells every booking is released
   with SQL (untimed), so the pool never fills;
3. runs the ceiling: the same guarded-commit SQL as ``app/capacity/commit/single.py`` plus the reservation row
   and the quota charge (reservation insert ``ON CONFLICT DO NOTHING``, quota rows, guarded quota UPDATE,
   pool ``FOR SHARE``, node ``FOR SHARE OF n`` with the schedulable predicate, devices ``FOR SHARE``,
   ``SAVEPOINT``, allocation insert, bookings ``INSERT ... ON CONFLICT DO NOTHING RETURNING``, the
   ``node_resources`` row lock and the guarded scalar-holding ``INSERT ... SELECT ... WHERE peak + n <=
   floor(allocatable * ratio) RETURNING``, status update; the quota charge is the row lock and one guarded
   quota-holding insert for all its resources) directly with asyncpg at the same
   concurrencies. The ceiling picks atoms round-robin over nodes and rolls the booking window forward
   once every atom of the pool is used, so it never loses a race: it is the commit alone;
4. prints the ratio service / ceiling, and preview p50 / p99 (plus the cold first request, which loads
   the pool cache) at 1,000 and 10,000 nodes;
5. the future-holdings case: one node already holding 1,000 future reservations (bookings, cpu and quota
   holdings spread over the lead time) against an empty node, interleaved: the median guarded commit
   alone and the median HTTP reserve, and their ratio busy / empty.

The database is dropped at the end. Everything (PostgreSQL, the service, these clients) shares the
machine's cores, as the ceiling does; the ratio is the figure to compare across changes.

    python bench/reserve.py [--seconds 4] [--clients 1,4,16] [--workers 1,2] [--no-10k]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.db.engine import migrate  # noqa: E402
from app.ids import new_id  # noqa: E402

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
GPUS = 8
NODE_CPU = 2048  # roomy: the service cells book many windows at once
FUTURE = 1000  # reservations a busy node already holds, in future windows (the "future holdings" case)
NODE_MEMORY = 2_000_000
# The DGX-1 hybrid cube mesh (tests/data/topo/01-dgx1-v100-hybrid-cube-mesh-mlx5.expected.json).
DGX1_NV = {(0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 5), (2, 3), (2, 6), (3, 7)}
DGX1_NV |= {(4, 5), (4, 6), (4, 7), (5, 6), (5, 7), (6, 7)}


@dataclass(frozen=True)
class Shape:
    """A request shape: GPUs and cpu per reservation, and an optional device selector."""

    name: str
    gpus: int
    cpu: int
    selector: str | None = None


SHAPES = (Shape("1 GPU + 4 cpu", 1, 4), Shape("8 GPU + 32 cpu", 8, 32))
# the preview-with-selector case of issue 15 (targets: p99 <= 30 ms at 1,000 nodes, <= 60 ms at 10,000)
SELECTOR_SHAPE = Shape("1 GPU selector", 1, 4, "gpuProduct in (V100-SXM2-32GB, A100), vramGiB >= 32")


@dataclass
class Cell:
    """One measurement: placements, elapsed seconds, latencies (ms) and other answers."""

    placed: int = 0
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)
    other: Counter[str] = field(default_factory=Counter)

    @property
    def rate(self) -> float:
        """Placements per second."""
        return self.placed / self.elapsed if self.elapsed > 0 else 0.0


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# ------------------------------------------------------------------------------------------ database


def dsn(url: str, database: str | None = None) -> str:
    """A plain ``postgresql://`` DSN for asyncpg (optionally on another database of the server)."""
    u = make_url(url).set(drivername="postgresql")
    if database is not None:
        u = u.set(database=database)
    return u.render_as_string(hide_password=False)


async def admin_exec(server_url: str, statement: str) -> None:
    """One statement on the server's ``postgres`` database (CREATE / DROP DATABASE)."""
    conn = await asyncpg.connect(dsn(server_url, "postgres"))
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


async def load_pool(conn: asyncpg.Connection, name: str, count: int) -> str:
    """Insert a pool of ``count`` nodes x 8 GPUs with bulk SQL; returns the pool id."""
    pool_id = new_id("pool")
    tag = secrets.token_hex(3)
    pairs = [(i, j) for i in range(GPUS) for j in range(i + 1, GPUS)]
    async with conn.transaction():
        await conn.execute("INSERT INTO pools (id, name) VALUES ($1, $2)", pool_id, name)
        await conn.execute(
            """INSERT INTO nodes (id, pool_id, name)
               SELECT 'node_' || $2 || lpad(g::text, 6, '0'), $1, $3 || '-' || lpad(g::text, 6, '0')
                 FROM generate_series(0, $4 - 1) g""",
            pool_id,
            tag,
            name,
            count,
        )
        await conn.execute(
            """INSERT INTO node_labels (node_id, key, value, source)
               SELECT n.id, l.key, l.value, 'operator'
                 FROM nodes n,
                      LATERAL (VALUES ('gpu.product', 'V100-SXM2-32GB'),
                                      ('rack', 'r' || (right(n.id, 6)::int % 40)::text)) AS l(key, value)
                WHERE n.pool_id = $1""",
            pool_id,
        )
        await conn.execute(
            """INSERT INTO devices (id, node_id, class, attributes, numa_node, ordinal)
               SELECT 'GPU-' || n.id || '-' || i, n.id, 'gpu',
                      '{"gpuProduct": "V100-SXM2-32GB", "vramGiB": 32, "migCapable": false}'::jsonb,
                      i / 4, i
                 FROM nodes n, generate_series(0, 7) i
                WHERE n.pool_id = $1""",
            pool_id,
        )
        await conn.execute(
            """INSERT INTO capacity_device_links (node_id, a, b, link)
               SELECT n.id, 'GPU-' || n.id || '-' || p.i, 'GPU-' || n.id || '-' || p.j, p.link
                 FROM nodes n, unnest($2::int[], $3::int[], $4::text[]) AS p(i, j, link)
                WHERE n.pool_id = $1""",
            pool_id,
            [i for i, _ in pairs],
            [j for _, j in pairs],
            ["NV2" if p in DGX1_NV else "SYS" for p in pairs],
        )
        await conn.execute(
            """INSERT INTO node_resources (node_id, resource, allocatable)
               SELECT n.id, r.resource, r.amount
                 FROM nodes n, (VALUES ('cpu', $2::numeric), ('memory', $3::numeric)) AS r(resource, amount)
                WHERE n.pool_id = $1""",
            pool_id,
            NODE_CPU,
            NODE_MEMORY,
        )
        await conn.execute(
            """INSERT INTO pool_capacity_rollup (pool_id, resource, total)
               VALUES ($1, 'gpu', $2), ($1, 'cpu', $3), ($1, 'memory', $4)""",
            pool_id,
            count * GPUS,
            count * NODE_CPU,
            count * NODE_MEMORY,
        )
    return pool_id


async def reset(conn: asyncpg.Connection) -> None:
    """Release everything between cells (untimed): no bookings, holdings, allocations or reservations."""
    await conn.execute("TRUNCATE device_bookings, scalar_holdings, quota_holdings, allocations, reservations")
    await conn.execute(
        "VACUUM ANALYZE device_bookings, scalar_holdings, quota_holdings, allocations, reservations"
    )


# ------------------------------------------------------------------------------------------ service


@dataclass
class Service:
    """A running ``better-compute serve`` subprocess."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) used so far by the service and its worker processes (Linux
        ``/proc``): a figure that other work on the machine does not inflate, unlike wall time."""
        tick = os.sysconf("SC_CLK_TCK")
        children: dict[int, list[int]] = {}
        times: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            pid = int(entry.name)
            children.setdefault(int(fields[1]), []).append(pid)
            times[pid] = int(fields[11]) + int(fields[12])
        total, todo = 0, [self.process.pid]
        while todo:
            pid = todo.pop()
            total += times.get(pid, 0)
            todo.extend(children.get(pid, []))
        return total / tick

    def stop(self) -> None:
        """Terminate the service (its uvicorn workers exit with it)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_service(url: str, admin_key: str, workers: int, log_dir: Path, placer: str = "inline") -> Service:
    """Start ``better-compute serve --workers <n>`` on a free port of 127.0.0.1 (not yet healthy).

    Runs ``python -m app.cli`` from this checkout, so the code beside the script is what is measured.
    """
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "app.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    env = {**os.environ, "DATABASE_URL": url, "BC_BOOTSTRAP_ADMIN_KEY": admin_key}
    env["BC_CAPACITY_PLACER"] = placer
    env.setdefault("BC_RATE_LIMIT", "1000000/second")  # measure the service, not the per-key limit
    log = log_dir / f"serve-{placer}-w{workers}-{port}.log"
    with log.open("wb") as handle:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Service(process, f"http://127.0.0.1:{port}", log)


async def start_service(
    url: str, admin_key: str, workers: int, log_dir: Path, placer: str = "inline"
) -> Service:
    """Start the service and wait for ``/healthz``; raises RuntimeError with its log if it fails."""
    service = spawn_service(url, admin_key, workers, log_dir, placer)
    process, log = service.process, service.log
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient(timeout=2) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the service exited:\n{log.read_text(errors='replace')[-4000:]}")
            try:
                if (await client.get(service.url + "/healthz")).status_code == 200:
                    return service
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
    service.stop()
    raise RuntimeError(f"the service did not answer /healthz:\n{log.read_text(errors='replace')[-4000:]}")


def reservation_body(pool_id: str, tenant: str, shape: Shape) -> dict[str, Any]:
    """A reservation (or preview) body for ``shape``, one day from now."""
    device: dict[str, Any] = {"class": "gpu", "count": shape.gpus}
    if shape.selector:
        device["selector"] = shape.selector
    return {
        "tenantId": tenant,
        "poolId": pool_id,
        "devices": [device],
        "resources": {"cpu": shape.cpu},
        "duration": "1d",
        "idempotencyKey": new_id("bench"),
    }


async def http_cell(
    client: httpx.AsyncClient, pool_id: str, shape: Shape, n: int, seconds: float, cap: int, tenants: int
) -> Cell:
    """``n`` clients reserve ``shape`` for ``seconds`` (or until ``cap`` placements)."""
    cell = Cell()
    end = time.perf_counter() + seconds

    async def one(k: int) -> None:
        tenant = f"bench-t{k % tenants}"
        while time.perf_counter() < end and cell.placed < cap:
            t0 = time.perf_counter()
            r = await client.post("/v1/reservations", json=reservation_body(pool_id, tenant, shape))
            took = (time.perf_counter() - t0) * 1000
            if r.status_code == 201 and r.json()["status"] == "placed":
                cell.placed += 1
                cell.latencies.append(took)
            elif r.status_code == 201:
                message = r.json()["conditions"][0]["message"]
                cell.other["lost races" if message.startswith("Unschedulable after") else "pending"] += 1
            else:
                cell.other[f"http {r.status_code}"] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(n)))
    cell.elapsed = time.perf_counter() - t0
    return cell


ROUTE_MISSING = "n/a: route missing"
DECIDED_WAIT = 30  # GET /v1/reservations/{id}?waitSeconds=N, at most 30


@dataclass
class Missing:
    """A mode the service does not offer (pool-lease or bulk before issue 15 part A is merged)."""

    why: str = ROUTE_MISSING


async def lease_cell(
    client: httpx.AsyncClient, pool_id: str, shape: Shape, n: int, seconds: float, cap: int, tenants: int
) -> Cell | Missing:
    """``n`` clients reserve through the pool-lease placer: POST answers 202 ``queued``, then GET
    ``?waitSeconds=30`` until decided; the latency is POST to decided. Missing when POST answers
    anything but 202 (the service has no pool-lease placer)."""
    probe = await client.post("/v1/reservations", json=reservation_body(pool_id, "bench-probe", shape))
    if probe.status_code != 202:
        return Missing(f"{ROUTE_MISSING} (POST answered {probe.status_code}, not 202 queued)")
    cell = Cell()
    end = time.perf_counter() + seconds

    async def one(k: int) -> None:
        tenant = f"bench-t{k % tenants}"
        while time.perf_counter() < end and cell.placed < cap:
            t0 = time.perf_counter()
            r = await client.post("/v1/reservations", json=reservation_body(pool_id, tenant, shape))
            view = r.json()
            while r.status_code in (200, 202) and view.get("status") == "queued":
                r = await client.get(f"/v1/reservations/{view['id']}", params={"waitSeconds": DECIDED_WAIT})
                view = r.json()
            took = (time.perf_counter() - t0) * 1000
            if view.get("status") == "placed":
                cell.placed += 1
                cell.latencies.append(took)
            else:
                cell.other[str(view.get("status") or f"http {r.status_code}")] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(n)))
    cell.elapsed = time.perf_counter() - t0
    return cell


async def bulk_cell(
    client: httpx.AsyncClient,
    pool_id: str,
    shape: Shape,
    n: int,
    seconds: float,
    cap: int,
    tenants: int,
    batch: int = 64,
) -> Cell | Missing:
    """``n`` clients each POST ``/v1/reservations/batch {items: [64 ReservationRequest]}`` -> 200
    ``{items: [{status, reservation | error}]}``; placements/s counts placed items, the latency is per
    call. Missing when the route answers 404 or 405."""
    cell = Cell()
    end = time.perf_counter() + seconds
    missing: list[int] = []

    async def one(k: int) -> None:
        tenant = f"bench-t{k % tenants}"
        while time.perf_counter() < end and cell.placed < cap and not missing:
            items = [reservation_body(pool_id, tenant, shape) for _ in range(batch)]
            t0 = time.perf_counter()
            r = await client.post("/v1/reservations/batch", json={"items": items})
            took = (time.perf_counter() - t0) * 1000
            if r.status_code in (404, 405):
                missing.append(r.status_code)
                return
            if r.status_code != 200:
                cell.other[f"http {r.status_code}"] += 1
                continue
            cell.latencies.append(took)
            for item in r.json()["items"]:
                status = (item.get("reservation") or {}).get("status")
                if status == "placed":
                    cell.placed += 1
                else:
                    cell.other[str(status or item.get("status"))] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(n)))
    cell.elapsed = time.perf_counter() - t0
    if missing:
        return Missing(f"{ROUTE_MISSING} (POST /v1/reservations/batch answered {missing[0]})")
    return cell


async def preview_latency(
    client: httpx.AsyncClient, pool_id: str, shape: Shape, repeat: int
) -> tuple[float, list[float]]:
    """The first preview (cold pool cache in this process) and ``repeat`` warm previews (ms)."""
    times: list[float] = []
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        r = await client.post("/v1/capacity/preview", json=reservation_body(pool_id, "bench-preview", shape))
        times.append((time.perf_counter() - t0) * 1000)
        if r.status_code != 200 or not r.json()["fits"]:
            raise RuntimeError(f"preview failed: {r.status_code} {r.text[:300]}")
    return times[0], times[1:]


# ------------------------------------------------------------------------------------------ ceiling

SQL_RESERVATION = """
INSERT INTO reservations (id, tenant_id, pool_id, status, spec, spec_hash, idempotency_key)
VALUES ($1, $2, $3, 'pending', $4::jsonb, $5, $6)
ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING id"""
SQL_QUOTA_ROWS = """
INSERT INTO quota_usage (tenant_id, pool_id, resource)
SELECT $1, $2, unnest($3::text[]) ON CONFLICT DO NOTHING"""
SQL_QUOTA_LOCK = """
SELECT resource FROM quota_usage WHERE tenant_id = $1 AND pool_id = $2 AND resource = ANY($3::text[])
 ORDER BY resource FOR UPDATE"""
# the peak held over [$s, $e) by the rows of one key (app/db/windows.py), as a scalar subquery
PEAK = """(SELECT coalesce(max(held), 0) FROM (
  SELECT sum(delta) OVER (ORDER BY at, delta) AS held FROM (
    SELECT greatest(starts_at, {s}) AS at, amount AS delta FROM {table}
     WHERE {key} AND ends_at > {s} AND starts_at < {e}
    UNION ALL
    SELECT ends_at, -amount FROM {table}
     WHERE {key} AND ends_at > {s} AND starts_at < {e} AND ends_at < {e}
  ) events) running)"""
# every resource of the charge in one guarded statement (app/quota/charges.py)
SQL_QUOTA_CHARGE = (
    """
INSERT INTO quota_holdings (reservation_id, resource, tenant_id, pool_id, amount, starts_at, ends_at)
SELECT $5, w.resource, $1, $2, w.amount, $6, $7 FROM unnest($3::text[], $4::numeric[]) AS w(resource, amount)
 WHERE (SELECT l."limit" FROM quota_limits l
         WHERE l.tenant_id = $1 AND l.pool_id = $2 AND l.resource = w.resource) IS NULL
    OR """
    + PEAK.format(
        table="quota_holdings",
        key="tenant_id = $1 AND pool_id = $2 AND resource = w.resource",
        s="$6",
        e="$7",
    )
    + """ + w.amount <= (SELECT l."limit" FROM quota_limits l
                          WHERE l.tenant_id = $1 AND l.pool_id = $2 AND l.resource = w.resource)
RETURNING resource"""
)
SQL_POOL = "SELECT id, archived_at FROM pools WHERE id = $1 FOR SHARE"
SQL_NODE = """
SELECT n.id FROM nodes n JOIN pools p ON p.id = n.pool_id
 WHERE n.id = $1 AND n.pool_id = $2 AND p.archived_at IS NULL
   AND coalesce(n.no_schedule_reasons, '{}'::text[]) <@ ARRAY['tainted dedicated=' || $3]::text[]
   FOR SHARE OF n"""
SQL_DEVICES = """
SELECT id, class FROM devices
 WHERE id = ANY($1::text[]) AND node_id = $2 AND healthy AND bookable ORDER BY id FOR SHARE"""
SQL_ALLOCATION = """
INSERT INTO allocations (id, reservation_id, pool_id, node_id, atoms, resources, during)
VALUES ($1, $2, $3, $4, $5::text[], $6::jsonb, tstzrange($7, $8, '[)'))"""
SQL_BOOKINGS = """
INSERT INTO device_bookings (device_pk, device_id, pool_id, allocation_id, during)
SELECT pk, id, $2, $3, tstzrange($4, $5, '[)') FROM devices WHERE id = ANY($1::text[]) AND deleted_at IS NULL
ON CONFLICT DO NOTHING RETURNING device_id"""
SQL_SCALAR_LOCK = "SELECT 1 FROM node_resources WHERE node_id = $1 AND resource = $2 FOR UPDATE"
SQL_SCALAR = (
    """
INSERT INTO scalar_holdings (allocation_id, resource, node_id, pool_id, amount, starts_at, ends_at)
SELECT $4, $2, $1, $5, $3, $6, $7 FROM node_resources nr
 WHERE nr.node_id = $1 AND nr.resource = $2
   AND """
    + PEAK.format(table="scalar_holdings", key="node_id = $1 AND resource = $2", s="$6", e="$7")
    + """ + $3 <= floor(nr.allocatable * nr.ratio)
RETURNING resource"""
)
SQL_PLACED = """
UPDATE reservations SET status = 'placed', conditions = '[]', updated_at = now(), ends_at = $2
 WHERE id = $1"""


async def guarded_commit(
    conn: asyncpg.Connection,
    pool_id: str,
    tenant: str,
    node_id: str,
    atoms: list[str],
    cpu: int,
    start: datetime,
    end: datetime,
) -> bool:
    """One placement transaction with the service's statements; False when a guard answered short."""
    reservation_id = new_id("res")
    allocation_id = new_id("alloc")
    spec = json.dumps({"devices": [{"class": "gpu", "count": len(atoms)}], "resources": {"cpu": str(cpu)}})
    async with conn.transaction():
        if (
            await conn.fetchval(SQL_RESERVATION, reservation_id, tenant, pool_id, spec, "h", reservation_id)
            is None
        ):
            return False
        if len(await conn.fetch(SQL_QUOTA_LOCK, tenant, pool_id, ["cpu", "gpu"])) < 2:
            await conn.execute(SQL_QUOTA_ROWS, tenant, pool_id, ["cpu", "gpu"])
            await conn.fetch(SQL_QUOTA_LOCK, tenant, pool_id, ["cpu", "gpu"])
        amounts = [Decimal(cpu), Decimal(len(atoms))]
        charged = await conn.fetch(
            SQL_QUOTA_CHARGE, tenant, pool_id, ["cpu", "gpu"], amounts, reservation_id, start, end
        )
        if len(charged) < 2:
            return False
        await conn.fetchrow(SQL_POOL, pool_id)
        await conn.execute("SAVEPOINT capacity_place_1")
        if await conn.fetchval(SQL_NODE, node_id, pool_id, tenant) is None:
            return False
        if len(await conn.fetch(SQL_DEVICES, atoms, node_id)) != len(atoms):
            return False
        await conn.execute(
            SQL_ALLOCATION,
            allocation_id,
            reservation_id,
            pool_id,
            node_id,
            atoms,
            json.dumps({"cpu": str(cpu)}),
            start,
            end,
        )
        if len(await conn.fetch(SQL_BOOKINGS, atoms, pool_id, allocation_id, start, end)) != len(atoms):
            return False
        await conn.fetch(SQL_SCALAR_LOCK, node_id, "cpu")
        if await conn.fetchval(SQL_SCALAR, node_id, "cpu", cpu, allocation_id, pool_id, start, end) is None:
            return False
        await conn.execute("RELEASE SAVEPOINT capacity_place_1")
        await conn.execute(SQL_PLACED, reservation_id, end)
    return True


async def ceiling_cell(
    pg: asyncpg.Pool, pool_id: str, node_ids: list[str], shape: Shape, n: int, seconds: float
) -> Cell:
    """``n`` asyncpg connections commit ``shape`` placements for ``seconds``, never colliding: slot g
    takes node ``g % nodes`` and, per turn of the pool, the next atoms or the next day's window."""
    cell = Cell()
    per_node = GPUS // shape.gpus
    slots = len(node_ids) * per_node
    counter = itertools.count()
    async with pg.acquire() as conn:
        base: datetime = await conn.fetchval("SELECT date_trunc('second', now())")
    end_at = time.perf_counter() + seconds

    async def one() -> None:
        async with pg.acquire() as conn:
            while time.perf_counter() < end_at:
                g = next(counter)
                node = node_ids[g % len(node_ids)]
                first = ((g // len(node_ids)) % per_node) * shape.gpus
                atoms = [f"GPU-{node}-{i}" for i in range(first, first + shape.gpus)]
                start = base + timedelta(days=g // slots)
                t0 = time.perf_counter()
                ok = await guarded_commit(
                    conn, pool_id, f"ceil-t{g % n}", node, atoms, shape.cpu, start, start + timedelta(days=1)
                )
                if ok:
                    cell.placed += 1
                    cell.latencies.append((time.perf_counter() - t0) * 1000)
                else:
                    cell.other["short"] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    cell.elapsed = time.perf_counter() - t0
    return cell


# ------------------------------------------------------------------------------------------ future holdings

FUTURE_TENANT = "future-t"


async def load_future(
    conn: asyncpg.Connection, pool_id: str, node_id: str, count: int, base: datetime
) -> None:
    """Give ``node_id`` ``count`` placed reservations of 1 GPU + 4 cpu, one hour each, spread over the
    lead time from day 2 on (bookings, scalar and quota holdings as the service writes them)."""
    async with conn.transaction():
        await conn.execute(
            """INSERT INTO reservations
                      (id, tenant_id, pool_id, status, spec, spec_hash, idempotency_key, ends_at)
               SELECT 'res_f' || k, $2, $1, 'placed', '{}', '-', 'future-' || k,
                      $3::timestamptz + interval '2 days 1 hour' + k * interval '8 hours 30 minutes'
                 FROM generate_series(0, $4 - 1) k""",
            pool_id,
            FUTURE_TENANT,
            base,
            count,
        )
        await conn.execute(
            """INSERT INTO allocations (id, reservation_id, pool_id, node_id, atoms, resources, during)
               SELECT 'alloc_f' || k, 'res_f' || k, $1, $2, ARRAY['GPU-' || $2 || '-' || (k % 8)],
                      '{"cpu": "4"}', tstzrange(s, s + interval '1 hour')
                 FROM generate_series(0, $4 - 1) k,
                      LATERAL (
                        SELECT $3::timestamptz + interval '2 days' + k * interval '8 hours 30 minutes' AS s
                      ) w""",
            pool_id,
            node_id,
            base,
            count,
        )
        await conn.execute(
            """INSERT INTO device_bookings (device_pk, device_id, pool_id, allocation_id, during)
               SELECT d.pk, d.id, a.pool_id, a.id, a.during
                 FROM allocations a JOIN devices d ON d.node_id = a.node_id AND d.id = a.atoms[1]
                WHERE a.node_id = $1""",
            node_id,
        )
        await conn.execute(
            """INSERT INTO scalar_holdings
                      (allocation_id, resource, node_id, pool_id, amount, starts_at, ends_at)
               SELECT id, 'cpu', node_id, pool_id, 4, lower(during), upper(during) FROM allocations
                WHERE node_id = $1""",
            node_id,
        )
        await conn.execute(
            """INSERT INTO quota_holdings
                      (reservation_id, resource, tenant_id, pool_id, amount, starts_at, ends_at)
               SELECT a.reservation_id, r.resource, $2, a.pool_id, r.n, lower(a.during), upper(a.during)
                 FROM allocations a, (VALUES ('cpu', 4), ('gpu', 1)) AS r(resource, n)
                WHERE a.node_id = $1""",
            node_id,
            FUTURE_TENANT,
        )
    await conn.execute("ANALYZE")


async def future_case(
    pg: asyncpg.Pool, client: httpx.AsyncClient, empty: str, busy: str, repeat: int
) -> dict[str, tuple[float, float]]:
    """Median ms of (a) the guarded commit alone and (b) an HTTP reserve, on an empty node and on one
    holding ``FUTURE`` future reservations, interleaved so both see the same machine load. Every
    measured window lies in the next hours, before the busy node's first future window."""
    async with pg.acquire() as conn:
        nodes = {p: await conn.fetchval("SELECT id FROM nodes WHERE pool_id = $1", p) for p in (empty, busy)}
        base: datetime = await conn.fetchval("SELECT date_trunc('second', now()) + interval '5 minutes'")
        for p in (empty, busy):
            await conn.execute(
                """INSERT INTO quota_limits (tenant_id, pool_id, resource, "limit")
                   VALUES ($1, $2, 'gpu', 100000), ($1, $2, 'cpu', 1000000)""",
                FUTURE_TENANT,
                p,
            )
    commit: dict[str, list[float]] = {empty: [], busy: []}
    reserve: dict[str, list[float]] = {empty: [], busy: []}
    async with pg.acquire() as conn:
        for k in range(repeat):
            for p in (empty, busy):
                start = base + timedelta(minutes=k)
                atoms = [f"GPU-{nodes[p]}-{k % GPUS}"]
                t0 = time.perf_counter()
                ok = await guarded_commit(
                    conn, p, FUTURE_TENANT, nodes[p], atoms, 4, start, start + timedelta(minutes=1)
                )
                commit[p].append((time.perf_counter() - t0) * 1000)
                if not ok:
                    raise RuntimeError(f"the future-holdings commit {k} on {p} answered short")
    for k in range(repeat):
        for p in (empty, busy):
            body = reservation_body(p, FUTURE_TENANT, SHAPES[0])
            body["start"] = (base + timedelta(hours=6, minutes=k)).isoformat()
            body["duration"] = 60
            t0 = time.perf_counter()
            r = await client.post("/v1/reservations", json=body)
            reserve[p].append((time.perf_counter() - t0) * 1000)
            if r.status_code != 201 or r.json()["status"] != "placed":
                raise RuntimeError(f"the future-holdings reserve {k} failed: {r.status_code} {r.text[:300]}")
    return {
        "commit": (statistics.median(commit[empty]), statistics.median(commit[busy])),
        "reserve": (statistics.median(reserve[empty]), statistics.median(reserve[busy])),
    }


# ------------------------------------------------------------------------------------------ driver


async def timed(label: str, make: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``make()`` and print how long it took."""
    t0 = time.perf_counter()
    out = await make()
    print(f"  {label}: {time.perf_counter() - t0:.1f} s", flush=True)
    return out


async def run(args: argparse.Namespace) -> None:
    """The whole benchmark (see the module docstring)."""
    server_url = args.database_url
    name = f"bc_bench_{secrets.token_hex(4)}"
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    admin_key = "bench-" + secrets.token_hex(16)
    clients_list = [int(x) for x in args.clients.split(",")]
    workers_list = [int(x) for x in args.workers.split(",")]
    modes = set(args.modes.split(","))
    log_dir = Path(tempfile.mkdtemp(prefix="bc-bench-"))
    services: list[Service] = []
    print(f"database {name} on {make_url(server_url).host}; service logs in {log_dir}", flush=True)
    await admin_exec(server_url, f'CREATE DATABASE "{name}"')
    pg: asyncpg.Pool | None = None
    try:
        await timed("migrate", lambda: asyncio.to_thread(migrate, url))
        pg = await asyncpg.create_pool(dsn(url), min_size=2, max_size=max(clients_list) + 2)
        assert pg is not None
        async with pg.acquire() as conn:
            pool_1k = await timed(
                f"load {args.nodes:,} nodes x 8 GPUs", lambda: load_pool(conn, "bench-1k", args.nodes)
            )
            pool_10k = None
            if not args.no_10k:
                pool_10k = await timed(
                    f"load {args.big_nodes:,} nodes x 8 GPUs",
                    lambda: load_pool(conn, "bench-10k", args.big_nodes),
                )
            pool_empty = await load_pool(conn, "bench-empty-node", 1)
            pool_busy = await load_pool(conn, "bench-busy-node", 1)
            busy_node = await conn.fetchval("SELECT id FROM nodes WHERE pool_id = $1", pool_busy)
            horizon: datetime = await conn.fetchval("SELECT date_trunc('second', now())")
            await timed(
                f"load {FUTURE:,} future reservations on one node",
                lambda: load_future(conn, pool_busy, busy_node, FUTURE, horizon),
            )
            await conn.execute("ANALYZE")
            node_ids = [
                r["id"]
                for r in await conn.fetch("SELECT id FROM nodes WHERE pool_id = $1 ORDER BY id", pool_1k)
            ]

        cells: dict[tuple[int, str, int], Cell | Missing] = {}  # (workers, mode, clients)
        cpu: dict[tuple[int, str, int], float] = {}  # the generator's CPU, share of one core
        previews: dict[tuple[int, str], tuple[float, list[float]]] = {}
        ceiling: dict[int, Cell] = {}
        single_tenant: dict[int, Cell] = {}
        future: dict[str, tuple[float, float]] = {}
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        shape = SHAPES[0]
        cap = int(0.8 * len(node_ids) * (GPUS // shape.gpus))
        headers = {"Authorization": f"Bearer {admin_key}"}

        async def measure(key: tuple[int, str, int], make: Callable[[], Awaitable[Cell | Missing]]) -> None:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            cell = cells[key] = await make()
            cpu[key] = (time.process_time() - cpu0) / max(time.perf_counter() - wall0, 1e-9)
            shown = cell.why if isinstance(cell, Missing) else f"{cell.rate:7.1f}/s {dict(cell.other) or ''}"
            print(f"  w{key[0]} {key[1]:10} N={key[2]:<3} {shown}", flush=True)
            async with pg.acquire() as conn:
                await reset(conn)

        for workers in workers_list:
            first = workers == workers_list[0]
            for placer in ("inline", "pool-lease"):
                if placer == "pool-lease" and "pool-lease" not in modes:
                    continue
                if placer == "inline" and not modes & {"inline", "bulk", "extras"}:
                    continue
                service = await timed(
                    f"start service --workers {workers} ({placer})",
                    lambda w=workers, p=placer: start_service(url, admin_key, w, log_dir, p),
                )
                services.append(service)
                async with httpx.AsyncClient(
                    base_url=service.url, headers=headers, timeout=120, limits=limits
                ) as client:
                    # warm every worker's pool cache and connections (untimed)
                    await asyncio.gather(
                        *(
                            client.post("/v1/capacity/preview", json=reservation_body(pool_1k, "w", shape))
                            for _ in range(8 * workers)
                        )
                    )
                    if placer == "pool-lease":
                        for n in clients_list:
                            await measure(
                                (workers, "pool-lease", n),
                                lambda n=n: lease_cell(client, pool_1k, shape, n, args.seconds, cap, n),
                            )
                    else:
                        if first and "extras" in modes:
                            future = await timed(
                                "future holdings case",
                                lambda: future_case(pg, client, pool_empty, pool_busy, args.future_repeat),
                            )
                            async with pg.acquire() as conn:
                                await reset(conn)
                            for s in (*SHAPES, SELECTOR_SHAPE):
                                previews[(args.nodes, s.name)] = await preview_latency(
                                    client, pool_1k, s, args.preview_repeat
                                )
                            if pool_10k is not None:
                                for s in (*SHAPES, SELECTOR_SHAPE):
                                    previews[(args.big_nodes, s.name)] = await timed(
                                        f"preview {args.big_nodes:,} nodes, {s.name}",
                                        lambda s=s: preview_latency(
                                            client, pool_10k, s, args.big_preview_repeat
                                        ),
                                    )
                        for n in clients_list if "inline" in modes else []:
                            await measure(
                                (workers, "inline", n),
                                lambda n=n: http_cell(
                                    client, pool_1k, shape, n, args.seconds, cap, tenants=n
                                ),
                            )
                        for n in clients_list if "bulk" in modes else []:
                            await measure(
                                (workers, "bulk", n),
                                lambda n=n: bulk_cell(client, pool_1k, shape, n, args.seconds, cap, n),
                            )
                        if first and "extras" in modes:
                            n = args.one_tenant_clients
                            single_tenant[n] = await http_cell(
                                client, pool_1k, shape, n, args.seconds, cap, tenants=1
                            )
                            async with pg.acquire() as conn:
                                await reset(conn)
                service.stop()
            if first:
                for n in clients_list:
                    cell = await ceiling_cell(pg, pool_1k, node_ids, shape, n, args.seconds)
                    ceiling[n] = cell
                    print(f"  ceiling    N={n:<3} {cell.rate:7.1f}/s", flush=True)
                    async with pg.acquire() as conn:
                        await reset(conn)

        report(args, clients_list, workers_list, cells, cpu, ceiling, single_tenant, previews, future)
    finally:
        for service in services:
            service.stop()
        if pg is not None:
            await pg.close()
        await admin_exec(
            server_url,
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' "
            "AND pid <> pg_backend_pid()",
        )
        await admin_exec(server_url, f'DROP DATABASE IF EXISTS "{name}"')
        print(f"dropped {name}")


def report(
    args: argparse.Namespace,
    clients_list: list[int],
    workers_list: list[int],
    cells: dict[tuple[int, str, int], Cell | Missing],
    cpu: dict[tuple[int, str, int], float],
    ceiling: dict[int, Cell],
    single_tenant: dict[int, Cell],
    previews: dict[tuple[int, str], tuple[float, list[float]]],
    future: dict[str, tuple[float, float]],
) -> None:
    """Print the one results table (and the preview and future-holdings figures)."""
    load = os.getloadavg()
    print()
    print(
        f"Reserve throughput, {args.nodes:,} nodes x 8 GPUs, {SHAPES[0].name}, {args.seconds:g} s a cell; "
        f"placements/s, ratio = mode / ceiling at the same clients, latency p50/p99 ms (bulk: per call "
        f"of 64); gen cpu = the load generator's CPU, share of one core; load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores"
    )
    head = (
        f"{'procs':>5} {'mode':10} {'N':>3} | {'rate/s':>8} {'ratio':>6} {'p50':>7} {'p99':>7} {'gen cpu':>7}"
    )
    print(head)
    print("-" * len(head))
    for n in clients_list:
        c = ceiling.get(n)
        if c is not None:
            print(
                f"{'-':>5} {'ceiling':10} {n:>3} | {c.rate:8.1f} {1.0:6.2f} {pct(c.latencies, 0.5):7.2f} "
                f"{pct(c.latencies, 0.99):7.2f}"
            )
    for w in workers_list:
        for mode in ("inline", "pool-lease", "bulk"):
            for n in clients_list:
                cell = cells.get((w, mode, n))
                if cell is None:
                    continue
                if isinstance(cell, Missing):
                    print(f"{w:>5} {mode:10} {n:>3} | {cell.why}")
                    continue
                c = ceiling.get(n)
                ratio = cell.rate / c.rate if c and c.rate else float("nan")
                line = (
                    f"{w:>5} {mode:10} {n:>3} | {cell.rate:8.1f} {ratio:6.3f} "
                    f"{pct(cell.latencies, 0.5):7.1f} {pct(cell.latencies, 0.99):7.1f} "
                    f"{cpu.get((w, mode, n), 0.0):7.0%}"
                )
                if cell.other:
                    line += f" {dict(cell.other)}"
                print(line)
    for n, s in single_tenant.items():
        p50, p99 = pct(s.latencies, 0.5), pct(s.latencies, 0.99)
        print(
            f"{workers_list[0]:>5} {'one tenant':10} {n:>3} | {s.rate:8.1f} {'':6} {p50:7.1f} {p99:7.1f} "
            f"p99/p50 {p99 / p50 if p50 else float('nan'):.2f} (target <= 5) {dict(s.other) or ''}"
        )
    if future:
        print()
        print(f"A node holding {FUTURE:,} future reservations vs an empty one (1 client, median ms)")
        for what, (empty_ms, busy_ms) in future.items():
            print(f"  {what:8} empty {empty_ms:7.2f}  busy {busy_ms:7.2f}  ratio {busy_ms / empty_ms:5.2f}")
    print()
    print("Preview latency (1 client, ms): cold = first request of the process (loads the pool cache)")
    print(f"{'nodes':>7} {'shape':16} {'cold':>8} {'p50':>8} {'p99':>8} {'samples':>8}")
    for (nodes, shape_name), (cold, warm) in previews.items():
        print(
            f"{nodes:>7,} {shape_name:16} {cold:8.1f} {pct(warm, 0.5):8.1f} {pct(warm, 0.99):8.1f} "
            f"{len(warm):>8} (mean {statistics.fmean(warm):.1f})"
        )


def main() -> None:
    """Parse arguments and run the benchmark."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or DEFAULT_URL)
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds per cell")
    parser.add_argument("--clients", default="1,4,16", help="concurrent clients, comma-separated")
    parser.add_argument("--workers", default="1,2", help="service worker counts, comma-separated")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument(
        "--modes",
        default="inline,pool-lease,bulk,extras",
        help="what to measure, comma-separated (extras: previews, future holdings, one tenant)",
    )
    parser.add_argument("--one-tenant-clients", type=int, default=32, help="clients of the one-tenant row")
    parser.add_argument("--big-nodes", type=int, default=10_000)
    parser.add_argument("--no-10k", action="store_true", help="skip the 10,000-node preview")
    parser.add_argument("--preview-repeat", type=int, default=50)
    parser.add_argument("--big-preview-repeat", type=int, default=20)
    parser.add_argument(
        "--future-repeat", type=int, default=100, help="samples per side, future-holdings case"
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
