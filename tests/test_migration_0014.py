"""Migration 0014 frees a deleted node's device ids (docs/operating.md, "Maintenance: drain and delete"):
upgraded from 0013, the devices of a deleted node are marked deleted with it; a live device may then take
a deleted one's id; downgraded, the deleted device gives the id up again (renamed, as 0013 does for
names) while its bookings and allocations keep the id they were made with. On a database of its own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from tests.migrations import database_at, dsn, migrate_to

BEFORE = """
INSERT INTO pools (id, name) VALUES ('pool_m', 'migrated');
INSERT INTO nodes (id, pool_id, name, deleted_at) VALUES ('node_1', 'pool_m', 'h1', now());
INSERT INTO devices (id, node_id, class) VALUES ('GPU-A', 'node_1', 'gpu'), ('GPU-B', 'node_1', 'gpu');
INSERT INTO reservations (id, tenant_id, pool_id, status, spec, spec_hash, idempotency_key)
VALUES ('res_1', 'acme', 'pool_m', 'ended', '{}', '-', 'k1');
INSERT INTO allocations (id, reservation_id, pool_id, node_id, atoms, during)
VALUES ('alloc_1', 'res_1', 'pool_m', 'node_1', '{GPU-A}',
        tstzrange(now() - interval '2 h', now() - interval '1 h'));
INSERT INTO device_bookings (device_pk, device_id, pool_id, allocation_id, during)
SELECT d.pk, d.id, 'pool_m', 'alloc_1', a.during FROM devices d, allocations a WHERE d.id = 'GPU-A'
"""


@pytest.fixture
async def database() -> AsyncIterator[str]:
    """A database of its own, migrated to 0013 (dropped afterwards)."""
    async with database_at("0013") as url:
        yield url


async def run(url: str, *statements: str) -> list[tuple[object, ...]]:
    """Run ``statements`` in one transaction; the rows of the last."""
    conn = await asyncpg.connect(dsn(url))
    try:
        async with conn.transaction():
            for statement in statements[:-1]:
                await conn.execute(statement)
            return [tuple(r) for r in await conn.fetch(statements[-1])]
    finally:
        await conn.close()


DEVICES = "SELECT id, node_id, deleted_at IS NOT NULL FROM devices ORDER BY pk"
HISTORY = "SELECT b.device_id, a.atoms FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id"
AGAIN = "INSERT INTO devices (id, node_id, class) VALUES ('GPU-A', 'node_2', 'gpu')"


async def test_a_deleted_nodes_device_ids_are_freed_and_given_up_again_on_downgrade(database: str) -> None:
    await run(database, *BEFORE.strip().split(";\n"), "SELECT 1")

    await asyncio.to_thread(migrate_to, database, "upgrade", "head")
    assert await run(database, DEVICES) == [("GPU-A", "node_1", True), ("GPU-B", "node_1", True)]
    # the host registers again: GPU-A on a live node; a second live GPU-A is refused
    live = "INSERT INTO nodes (id, pool_id, name) VALUES ('node_2', 'pool_m', 'h1')"
    assert (await run(database, live, AGAIN, DEVICES))[2] == ("GPU-A", "node_2", False)
    with pytest.raises(asyncpg.UniqueViolationError):
        await run(database, AGAIN, "SELECT 1")

    # back: the deleted device gives its id up; its booking and allocation keep the one they were made with
    await asyncio.to_thread(migrate_to, database, "downgrade", "0013")
    assert await run(database, "SELECT id, node_id FROM devices ORDER BY pk") == [
        ("GPU-A~node_1", "node_1"),
        ("GPU-B", "node_1"),
        ("GPU-A", "node_2"),
    ]
    assert await run(database, HISTORY) == [("GPU-A", ["GPU-A"])]
    with pytest.raises(asyncpg.UniqueViolationError):  # every id unique again
        await run(database, "UPDATE devices SET id = 'GPU-B' WHERE id = 'GPU-A'", "SELECT 1")
    # and up again: the deleted node's devices are marked deleted once more
    await asyncio.to_thread(migrate_to, database, "upgrade", "head")
    assert [r[2] for r in await run(database, DEVICES)] == [True, True, False]
