"""A worker's consecutive batches of one pool share their reads (issue 15;
app/capacity/planning/shared_reads.py
``WarmReads``): the next batch of an unchanged pool sends no exceptions read and counts the earlier
batches' committed plans; a booking made elsewhere between batches is caught by the guarded commit and
the entry replanned on fresh reads, never double-booked; a release elsewhere never makes a pending
decision wrong; an inventory change, a stale read, a lost race or a rolled-back batch forces a fresh
read."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.commit.lost_races import NOT_SCHEDULABLE
from app.capacity.config import CapacityConfig
from app.capacity.placing.batch import BatchEntry, BatchOptions, place_batch
from app.capacity.placing.inline import Pending, Placed
from app.capacity.planning import shared_reads
from app.capacity.planning.shared_reads import WarmSlot
from app.capacity.planning.snapshot import PoolCache, read_pool_head
from app.capacity.queue import worker as queue
from app.db.tables import device_bookings, nodes, pools, quota_holdings, scalar_holdings
from app.placement.options import SchedulerOptions
from app.placement.request import ReservationRequest
from app.placement.schedulable import DEDICATION_PREFIX
from tests.capacity.helpers import book, db_time, make_pool_with_nodes, node_body
from tests.capacity.test_batch import _queue, _statuses
from tests.capacity.test_batch_shared_reads import _entries, _exception_reads, _request
from tests.round_trips import counting

OPTS = BatchOptions(SchedulerOptions(), 3)


async def _batch(
    engine: AsyncEngine, cache: PoolCache, pool: str, slot: WarmSlot, entries: list[BatchEntry]
) -> int:
    """One batch in its own transaction; how many exceptions reads it sent."""
    with counting(engine) as trips:
        async with engine.begin() as conn:
            tokens = await place_batch(conn, cache, OPTS, pool, entries, slot)
    for t in tokens:
        cache.forget(pool, t)
    return _exception_reads(trips.sent, engine.dialect)


async def _loaded_cache(engine: AsyncEngine, pool: str) -> PoolCache:
    cache = PoolCache()
    async with engine.connect() as conn:
        await cache.inventory(conn, await read_pool_head(conn, pool))
    return cache


async def _no_double_booking(engine: AsyncEngine) -> list[Any]:
    async with engine.connect() as conn:
        rows = (await conn.execute(sa.select(device_bookings.c.device_id, device_bookings.c.during))).all()
    by_atom: dict[str, list[Any]] = {}
    for atom, during in rows:
        for other in by_atom.get(atom, []):
            assert not (during.lower < other.upper and other.lower < during.upper), (atom, during, other)
        by_atom.setdefault(atom, []).append(during)
    return rows


async def test_a_second_batch_of_an_unchanged_pool_sends_no_exceptions_read(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body(f"n{i}", 2, cpu=8) for i in range(3)])
    start = await db_time(engine)
    cache, slot = await _loaded_cache(engine, pool), WarmSlot()
    first = await _entries(engine, pool, [_request(pool, start, cpu=3) for _ in range(3)])
    assert await _batch(engine, cache, pool, slot, first) == 1
    assert slot.reads is not None
    second = await _entries(engine, pool, [_request(pool, start, cpu=3) for _ in range(3)])
    assert await _batch(engine, cache, pool, slot, second) == 0
    for e in first + second:
        assert isinstance(e.outcome, Placed) and not e.lost, (e.outcome, e.lost)
    assert len(await _no_double_booking(engine)) == 6  # every atom once
    # the earlier batches' cpu counted: 3 + 3 per node of 8, so a third 3-cpu entry fits nowhere
    third = await _entries(engine, pool, [_request(pool, start, gpus=0, cpu=3)])
    await _batch(engine, cache, pool, slot, third)
    assert isinstance(third[0].outcome, Pending) and not third[0].lost, (third[0].outcome, third[0].lost)
    async with engine.connect() as conn:
        held = (await conn.execute(sa.select(sa.func.sum(scalar_holdings.c.amount)))).scalar_one()
    assert held == 18


async def test_a_booking_made_elsewhere_between_batches_is_caught_and_replanned(
    clean_db: AsyncEngine,
) -> None:
    engine = clean_db
    pool, views = await make_pool_with_nodes(engine, [node_body("only", 2, cpu=8)])
    node_id = views[0].id
    start = await db_time(engine)
    cache, slot = await _loaded_cache(engine, pool), WarmSlot()
    first = await _entries(engine, pool, [_request(pool, start)])
    await _batch(engine, cache, pool, slot, first)
    assert isinstance(first[0].outcome, Placed)
    [taken] = first[0].outcome.allocations[0].atoms
    async with engine.connect() as conn:
        atoms = [
            a.id for a in (await cache.inventory(conn, await read_pool_head(conn, pool))).nodes[node_id].atoms
        ]
    [last] = [a for a in atoms if a != taken]
    async with engine.begin() as conn:  # another replica books the last atom: the warm read misses it
        await book(conn, pool, node_id, [last], start, start + timedelta(hours=24))
    second = await _entries(engine, pool, [_request(pool, start)])
    await _batch(engine, cache, pool, slot, second)
    [e] = second
    assert e.lost and e.lost[0].node_id == node_id, e.lost  # planned on the warm read, lost at the commit
    assert isinstance(e.outcome, Pending), e.outcome  # replanned on fresh reads: nothing left
    assert slot.reads is None  # a lost race drops the warm reads
    assert len(await _no_double_booking(engine)) == 2


async def test_a_release_elsewhere_never_makes_a_pending_decision_wrong(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body("only", 1, cpu=8)])
    start = await db_time(engine)
    cache, slot = await _loaded_cache(engine, pool), WarmSlot()
    first = await _entries(engine, pool, [_request(pool, start)])
    await _batch(engine, cache, pool, slot, first)
    assert isinstance(first[0].outcome, Placed) and slot.reads is not None
    async with engine.begin() as conn:  # released elsewhere: the warm read still counts it booked
        await conn.execute(sa.delete(scalar_holdings))
        await conn.execute(sa.delete(device_bookings))
    second = await _entries(engine, pool, [_request(pool, start)])
    await _batch(engine, cache, pool, slot, second)
    assert isinstance(second[0].outcome, Placed), second[0].outcome  # the whole-pool read decides


async def test_an_inventory_change_forces_a_fresh_read(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body(f"n{i}", 4, cpu=16) for i in range(2)])
    start = await db_time(engine)
    cache, slot = await _loaded_cache(engine, pool), WarmSlot()
    await _batch(engine, cache, pool, slot, await _entries(engine, pool, [_request(pool, start)]))
    async with engine.begin() as conn:
        await conn.execute(
            sa.update(pools).where(pools.c.id == pool).values(inventory_version=pools.c.inventory_version + 1)
        )
    assert await _batch(engine, cache, pool, slot, await _entries(engine, pool, [_request(pool, start)])) == 1


async def test_a_stale_or_smaller_read_is_read_again(
    clean_db: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body(f"n{i}", 4, cpu=16) for i in range(2)])
    start = await db_time(engine)
    cache, slot = await _loaded_cache(engine, pool), WarmSlot()
    await _batch(engine, cache, pool, slot, await _entries(engine, pool, [_request(pool, start, cpu=2)]))
    # a larger amount than the read judged room for: read again
    assert (
        await _batch(engine, cache, pool, slot, await _entries(engine, pool, [_request(pool, start, cpu=4)]))
        == 1
    )
    monkeypatch.setattr(shared_reads, "WARM_SECONDS", 0.0)
    assert (
        await _batch(engine, cache, pool, slot, await _entries(engine, pool, [_request(pool, start, cpu=2)]))
        == 1
    )


async def test_the_workers_consecutive_batches_read_once_and_a_failed_batch_reads_again(
    clean_db: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body(f"c{i}", 4) for i in range(2)])
    cache = PoolCache()
    config = replace(CapacityConfig(SchedulerOptions()), placer="pool-lease", max_batch=3)
    ids = await _queue(engine, cache, config, pool, 7)
    worker = queue.QueueWorker(cache, config, sweep_seconds=3600)
    with counting(engine) as trips:
        assert await worker.run(engine) == 7  # 3 + 3 + 1, one exceptions read
    assert _exception_reads(trips.sent, engine.dialect) == 1, trips
    assert all(status == "placed" for status, _ in (await _statuses(engine, ids)).values())
    assert worker._warm[pool].reads is not None

    async def fail(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the decisions could not be written")

    body = ReservationRequest.model_validate(
        {"tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": 1}], "duration": "1h"}
        | {"idempotencyKey": "one-more"}
    )
    more = [(await queue.create(engine, cache, config, body))[0].id]
    monkeypatch.setattr(queue, "decide", fail)
    with pytest.raises(RuntimeError):
        await queue.work_batch(engine, cache, config, pool, worker._warm[pool])
    assert worker._warm[pool].reads is None  # rolled back: its plans never happened
    monkeypatch.undo()
    worker.heard_queue(pool)
    with counting(engine) as trips:
        assert await worker.run(engine) == 1
    assert _exception_reads(trips.sent, engine.dialect) == 1, trips
    assert (await _statuses(engine, more))[more[0]][0] == "placed"
    assert len(await _no_double_booking(engine)) == 8


async def test_a_later_batch_locks_every_tenants_quota_rows_in_one_statement(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body(f"n{i}", 8, cpu=64) for i in range(2)])
    start = await db_time(engine)
    cache, slot = await _loaded_cache(engine, pool), WarmSlot()
    tenants = ["t-b", "ta", "t_c", "T-d"]  # orders that differ between collations: locked in "C" order
    first = await _entries(engine, pool, [_request(pool, start, tenant=t) for t in tenants])
    await _batch(engine, cache, pool, slot, first)  # first charges: one tenant at a time, rows inserted
    assert {(t, r) for t, _, r in slot.usage} == {(t, r) for t in tenants for r in ("cpu", "gpu")}
    second = await _entries(engine, pool, [_request(pool, start, tenant=t) for t in tenants * 2])
    with counting(engine) as trips:
        async with engine.begin() as conn:
            tokens = await place_batch(conn, cache, OPTS, pool, second, slot)
    for t in tokens:
        cache.forget(pool, t)
    assert len([s for s in trips.sent if "FROM quota_usage" in s]) == 1, trips  # the lock, once
    # the planned nodes locked once for all the tenants
    assert len([s for s in trips.sent if s.startswith("SELECT nodes.id, w.tenant_id FROM nodes")]) == 1, trips
    assert all(isinstance(e.outcome, Placed) for e in first + second)
    async with engine.connect() as conn:
        charged = (await conn.execute(sa.select(sa.func.count()).select_from(quota_holdings))).scalar_one()
    assert charged == 2 * 12


async def test_the_one_statement_node_guard_judges_each_tenant_by_its_own_tolerations(
    clean_db: AsyncEngine,
) -> None:
    engine = clean_db
    pool, views = await make_pool_with_nodes(engine, [node_body("only", 2, cpu=8)])
    node_id = views[0].id
    start = await db_time(engine)
    entries = await _entries(engine, pool, [_request(pool, start, tenant=t) for t in ("acme", "other")])

    async def dedicate(attempt: int, candidates: list[Any]) -> None:
        if attempt == 1:  # after both planned on the node: it is dedicated to acme before their commit
            assert {c.node_id for c in candidates} == {node_id}
            async with engine.begin() as conn:
                await conn.execute(
                    sa.update(nodes)
                    .where(nodes.c.id == node_id)
                    .values(no_schedule_reasons=[DEDICATION_PREFIX + "acme"])
                )

    opts = BatchOptions(SchedulerOptions(), 3, before_commit=dedicate)
    async with engine.begin() as conn:
        await place_batch(conn, await _loaded_cache(engine, pool), opts, pool, entries)
    acme, other = entries
    assert isinstance(acme.outcome, Placed) and not acme.lost, (acme.outcome, acme.lost)
    assert other.lost and other.lost[0].kind == NOT_SCHEDULABLE, other.lost
    assert isinstance(other.outcome, Pending), other.outcome
