"""The schedulability rule exists twice (docs/placement-rules.md): in Python (app/placement/schedulable.py)
and as the
SQL predicates the commit locks with (app/capacity/predicates.py). Over generated nodes (NoSchedule
reasons incl. dedications to several tenants, duplicates, leasable, archived pools), each predicate
selects exactly the nodes its Python twin accepts, on real PostgreSQL.

The server is ``DATABASE_URL`` or ``postgresql://postgres@127.0.0.1:5432/test``; the test creates its
own uniquely named database, creates ``pools`` and ``nodes`` from ``app.db.tables``, and drops it after.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.capacity.predicates import leasable_sql_for, may_be_schedulable_sql, schedulable_sql_tolerating
from app.db.tables import metadata, nodes, pools
from app.placement.model import NodeInventory, NodeSnapshot, NodeState, PoolSnapshot
from app.placement.schedulable import ineligibility, lease_ineligibility, may_be_schedulable

ARCHIVED_AT = datetime(2026, 11, 1, tzinfo=UTC)
SERVER = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/test"
TENANTS = (None, "acme", "beta", "gamma", "")
REASONS = (
    "cordoned",
    "draining",
    "not ready",
    "heartbeat lost",
    "tainted gpu=maintenance",
    "tainted dedicated=acme",
    "tainted dedicated=beta",
    "tainted dedicated=acme-2",
    "tainted dedicated=",
    "tainted dedicated=ACME",
)


def _url(database: str, driver: str) -> str:
    return make_url(SERVER).set(drivername=driver, database=database).render_as_string(hide_password=False)


async def _admin(statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(_url("postgres", "postgresql"))
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@dataclass
class Database:
    loop: asyncio.AbstractEventLoop
    engine: AsyncEngine

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)


@pytest.fixture(scope="module")
def database() -> Iterator[Database]:
    loop = asyncio.new_event_loop()
    name = f"bc_schedulable_{os.getpid()}_{secrets.token_hex(4)}"
    try:
        loop.run_until_complete(_admin(f'CREATE DATABASE "{name}"'))
    except OSError as exc:  # no server: say so plainly rather than fail obscurely
        loop.close()
        pytest.skip(f"no PostgreSQL at {SERVER}: {exc}")
    engine = create_async_engine(_url(name, "postgresql+asyncpg"))

    async def create() -> None:
        async with engine.begin() as conn:
            await conn.run_sync(lambda sync: metadata.create_all(sync, tables=[pools, nodes]))

    db = Database(loop, engine)
    try:
        db.run(create())
        yield db
    finally:
        db.run(engine.dispose())
        loop.run_until_complete(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        loop.close()


node_rows = st.lists(
    st.tuples(
        st.integers(0, 1),  # pool
        st.booleans(),  # leasable
        st.lists(st.sampled_from(REASONS), max_size=4),  # no_schedule_reasons, duplicates allowed
    ),
    min_size=1,
    max_size=12,
)


async def _load(
    engine: AsyncEngine, archived: tuple[bool, bool], rows: list[tuple[int, bool, list[str]]]
) -> None:
    async with engine.begin() as conn:
        await conn.execute(sa.delete(nodes))
        await conn.execute(sa.delete(pools))
        await conn.execute(
            sa.insert(pools),
            [
                {
                    "id": f"pool_{p}",
                    "name": f"pool {p}",
                    "archived_at": ARCHIVED_AT if archived[p] else None,
                }
                for p in (0, 1)
            ],
        )
        await conn.execute(
            sa.insert(nodes),
            [
                {
                    "id": f"node_{i}",
                    "pool_id": f"pool_{p}",
                    "name": f"n{i}",
                    "leasable": leasable,
                    "no_schedule_reasons": reasons,
                }
                for i, (p, leasable, reasons) in enumerate(rows)
            ],
        )


async def _selected(engine: AsyncEngine, predicate: sa.ColumnElement[bool]) -> set[str]:
    async with engine.connect() as conn:
        result = await conn.execute(
            sa.select(nodes.c.id)
            .select_from(nodes.join(pools, pools.c.id == nodes.c.pool_id))
            .where(predicate)
        )
        return {row.id for row in result}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(archived=st.tuples(st.booleans(), st.booleans()), rows=node_rows)
def test_python_and_sql_agree(
    database: Database, archived: tuple[bool, bool], rows: list[tuple[int, bool, list[str]]]
) -> None:
    database.run(_load(database.engine, archived, rows))
    snapshots = {
        f"node_{i}": (
            NodeSnapshot(
                NodeInventory(id=f"node_{i}", name=f"n{i}"),
                NodeState(no_schedule_reasons=tuple(reasons), leasable=leasable),
            ),
            PoolSnapshot(id=f"pool_{p}", archived=archived[p]),
        )
        for i, (p, leasable, reasons) in enumerate(rows)
    }
    for tenant in TENANTS:
        expected = {n for n, (node, pool) in snapshots.items() if ineligibility(node, pool, tenant) is None}
        assert database.run(_selected(database.engine, schedulable_sql_tolerating(tenant))) == expected, (
            tenant
        )
        expected = {
            n for n, (node, pool) in snapshots.items() if lease_ineligibility(node, pool, tenant) is None
        }
        assert database.run(_selected(database.engine, leasable_sql_for(tenant))) == expected, tenant
    expected = {n for n, (node, pool) in snapshots.items() if may_be_schedulable(node, pool)}
    assert database.run(_selected(database.engine, may_be_schedulable_sql())) == expected
    # may-be-schedulable means: schedulable for some tenant (its dedication's, or anyone's)
    for n, (node, pool) in snapshots.items():
        dedicated = {r.removeprefix("tainted dedicated=") for r in node.state.no_schedule_reasons}
        some = any(ineligibility(node, pool, t) is None for t in set(TENANTS) | dedicated)
        assert (n in expected) is some
