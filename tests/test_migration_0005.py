"""Migration 0005 turns the counters of placed reservations into windowed holdings with the same totals
(issue 11), on a database of its own migrated to 0004 and filled the way the old code left it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import asyncpg
import pytest

from tests.migrations import database_at, dsn, migrate_to

BEFORE = """
INSERT INTO pools (id, name) VALUES ('pool_m', 'migrated');
INSERT INTO nodes (id, pool_id, name) VALUES ('node_1', 'pool_m', 'n1'), ('node_2', 'pool_m', 'n2');
INSERT INTO devices (id, node_id, class)
SELECT 'GPU-' || n || '-' || i, 'node_' || n, 'gpu' FROM generate_series(1, 2) n, generate_series(0, 3) i;
INSERT INTO node_resources (node_id, resource, allocatable, allocated)
VALUES ('node_1', 'cpu', 64, 24), ('node_2', 'cpu', 32, 8);
INSERT INTO reservations (id, tenant_id, pool_id, status, spec, spec_hash, idempotency_key) VALUES
  ('res_1', 'acme', 'pool_m', 'placed', '{}', '-', 'k1'),
  ('res_2', 'acme', 'pool_m', 'placed', '{}', '-', 'k2'),
  ('res_3', 'acme', 'pool_m', 'released', '{}', '-', 'k3');
INSERT INTO allocations (id, reservation_id, pool_id, node_id, atoms, resources, during, released_at) VALUES
  ('alloc_1', 'res_1', 'pool_m', 'node_1', '{GPU-1-0,GPU-1-1}', '{"cpu": "16"}', tstzrange($1, $2), NULL),
  ('alloc_2', 'res_2', 'pool_m', 'node_1', '{GPU-1-2}', '{"cpu": "8"}', tstzrange($2, $3), NULL),
  ('alloc_3', 'res_2', 'pool_m', 'node_2', '{GPU-2-0}', '{"cpu": "8"}', tstzrange($2, $3), NULL),
  ('alloc_4', 'res_3', 'pool_m', 'node_2', '{GPU-2-1}', '{"cpu": "4"}', tstzrange($1, $2), now());
INSERT INTO device_bookings (device_pk, device_id, pool_id, allocation_id, during)
SELECT d.pk, d.id, 'pool_m', a.id, a.during FROM allocations a JOIN devices d ON d.id = ANY(a.atoms)
 WHERE a.released_at IS NULL;
INSERT INTO quota_usage (tenant_id, pool_id, resource, used)
VALUES ('acme', 'pool_m', 'gpu', 4), ('acme', 'pool_m', 'cpu', 32);
INSERT INTO pool_capacity_rollup (pool_id, resource, total, allocated)
VALUES ('pool_m', 'gpu', 8, 4), ('pool_m', 'cpu', 96, 32);
"""


@pytest.fixture
async def database() -> AsyncIterator[str]:
    """A database of its own, migrated to 0004 (dropped afterwards)."""
    async with database_at("0004") as url:
        yield url


def _params(statement: str, values: tuple[datetime, ...]) -> tuple[datetime, ...]:
    """The leading ``values`` a statement refers to as ``$1``, ``$2``, ..."""
    return values[: max((i for i in range(1, len(values) + 1) if f"${i}" in statement), default=0)]


async def test_counters_become_windowed_holdings_with_the_same_totals(database: str) -> None:
    conn = await asyncpg.connect(dsn(database))
    try:
        t0: datetime = await conn.fetchval("SELECT date_trunc('second', now()) + interval '1 hour'")
        t1, t2 = t0 + timedelta(days=1), t0 + timedelta(days=2)
        async with conn.transaction():
            for statement in BEFORE.strip().split(";\n"):
                await conn.execute(statement, *_params(statement, (t0, t1, t2)))
        counters = {
            "node": dict(
                (r[0], r[1]) for r in await conn.fetch("SELECT node_id, allocated FROM node_resources")
            ),
            "quota": dict((r[0], r[1]) for r in await conn.fetch("SELECT resource, used FROM quota_usage")),
        }
    finally:
        await conn.close()

    await asyncio.to_thread(migrate_to, database, "upgrade", "head")

    conn = await asyncpg.connect(dsn(database))
    try:
        scalar = await conn.fetch(
            "SELECT allocation_id, node_id, resource, amount, starts_at, ends_at FROM scalar_holdings "
            "ORDER BY allocation_id"
        )
        assert [tuple(r) for r in scalar] == [
            ("alloc_1", "node_1", "cpu", 16, t0, t1),
            ("alloc_2", "node_1", "cpu", 8, t1, t2),
            ("alloc_3", "node_2", "cpu", 8, t1, t2),
        ]
        by_node = {n: sum(r["amount"] for r in scalar if r["node_id"] == n) for n in counters["node"]}
        assert by_node == counters["node"]  # node_1: 24, node_2: 8 (the released allocation held nothing)
        quota = await conn.fetch(
            "SELECT reservation_id, resource, tenant_id, amount, starts_at, ends_at FROM quota_holdings "
            "ORDER BY reservation_id, resource"
        )
        assert [tuple(r) for r in quota] == [
            ("res_1", "cpu", "acme", 16, t0, t1),
            ("res_1", "gpu", "acme", 2, t0, t1),
            ("res_2", "cpu", "acme", 16, t1, t2),
            ("res_2", "gpu", "acme", 2, t1, t2),
        ]
        by_resource = {r: sum(q["amount"] for q in quota if q["resource"] == r) for r in counters["quota"]}
        assert by_resource == counters["quota"]  # gpu 4, cpu 32
        ends = dict((r[0], r[1]) for r in await conn.fetch("SELECT id, ends_at FROM reservations"))
        assert ends == {"res_1": t1, "res_2": t2, "res_3": None}
        columns = {
            (r[0], r[1])
            for r in await conn.fetch(
                "SELECT table_name, column_name FROM information_schema.columns WHERE column_name IN "
                "('allocated', 'used') AND table_schema = 'public'"
            )
        }
        assert columns == set()  # the counters are gone
        await conn.execute(
            "UPDATE reservations SET status = 'ended' WHERE id = 'res_3'"
        )  # the new status is allowed
    finally:
        await conn.close()

    # and back: the counters are what the holdings hold (the ended reservation reads as released)
    await asyncio.to_thread(migrate_to, database, "downgrade", "0004")
    conn = await asyncpg.connect(dsn(database))
    try:
        assert (
            dict((r[0], r[1]) for r in await conn.fetch("SELECT node_id, allocated FROM node_resources"))
            == (counters["node"])
        )
        assert (
            dict((r[0], r[1]) for r in await conn.fetch("SELECT resource, used FROM quota_usage"))
            == (counters["quota"])
        )
        assert await conn.fetchval("SELECT status FROM reservations WHERE id = 'res_3'") == "released"
        rollup = dict(
            (r[0], r[1]) for r in await conn.fetch("SELECT resource, allocated FROM pool_capacity_rollup")
        )
        assert rollup == {"gpu": 4, "cpu": 32}
    finally:
        await conn.close()
