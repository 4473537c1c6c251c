"""A unit of work that PostgreSQL picks as a deadlock's victim is run again (app/db/tx.py), raced for
real on two connections: the service's transaction and another that takes the same two rows the other
way round."""

from __future__ import annotations

import asyncio

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db.tables import pools
from app.db.tx import transaction


async def test_a_deadlock_victim_is_run_again(clean_db: AsyncEngine) -> None:
    async with clean_db.begin() as conn:
        await conn.execute(sa.insert(pools), [{"id": "pool_a", "name": "a"}, {"id": "pool_b", "name": "b"}])
    first_locked, other_waits = asyncio.Event(), asyncio.Event()
    attempts: list[int] = []

    @transaction
    async def bump_a_then_b(conn: AsyncConnection) -> int:
        attempts.append(len(attempts) + 1)
        await conn.execute(sa.update(pools).where(pools.c.id == "pool_a").values(name="a1"))
        if len(attempts) == 1:
            first_locked.set()
            await other_waits.wait()
            await asyncio.sleep(0.2)  # the other transaction now waits for pool_a
        # the first attempt waits for pool_b, held by the other: a deadlock; this side detects it first
        # (its deadlock_timeout is PostgreSQL's default 1 s, the other's 30 s) and is its victim
        await conn.execute(sa.update(pools).where(pools.c.id == "pool_b").values(name="b1"))
        return len(attempts)

    async def the_other_way_round() -> None:
        async with clean_db.begin() as conn:
            await conn.exec_driver_sql("SET LOCAL deadlock_timeout = '30s'")
            await first_locked.wait()
            await conn.execute(sa.update(pools).where(pools.c.id == "pool_b").values(name="b2"))
            other_waits.set()
            await conn.execute(sa.update(pools).where(pools.c.id == "pool_a").values(name="a2"))

    done, _ = await asyncio.gather(bump_a_then_b(clean_db), the_other_way_round())
    assert done == 2 and attempts == [1, 2]
    async with clean_db.connect() as conn:
        names = dict((await conn.execute(sa.select(pools.c.id, pools.c.name))).all())
    assert names == {"pool_a": "a1", "pool_b": "b1"}  # the rerun committed after the other one
