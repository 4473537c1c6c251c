"""The pool-lease worker's claims (app/capacity/queue/worker.py) on real PostgreSQL: a run claims again only
after a full batch, a batch's own statements are its claim and one decide-and-notify, a claim counts
what another worker holds (so the run looks again), and the enqueue is one statement that answers
retries and unknown pools as the inline create does."""

from __future__ import annotations

from dataclasses import replace

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.config import CapacityConfig
from app.capacity.planning.snapshot import PoolCache
from app.capacity.queue import worker as queue
from app.capacity.reservations.create import create_reservation
from app.capacity.views import read_view, reservation_view
from app.db import locks
from app.db.tables import reservations
from app.errors import IdempotencyKeyReused, NotFound
from app.placement.options import SchedulerOptions
from app.placement.request import ReservationRequest
from tests.capacity.helpers import make_pool_with_nodes, node_body
from tests.capacity.test_batch import _queue, _statuses
from tests.round_trips import counting


def _config(max_batch: int = 64) -> CapacityConfig:
    return replace(CapacityConfig(SchedulerOptions()), placer="pool-lease", max_batch=max_batch)


def _body(pool: str, key: str, gpus: int = 1) -> ReservationRequest:
    return ReservationRequest.model_validate(
        {
            "tenantId": "acme",
            "poolId": pool,
            "devices": [{"class": "gpu", "count": gpus}],
            "duration": "1h",
            "idempotencyKey": key,
        }
    )


async def test_a_run_claims_again_only_after_a_full_batch(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body("c0", 8)])
    cache, config = PoolCache(), _config(max_batch=3)
    ids = await _queue(engine, cache, config, pool, 7)
    worker = queue.QueueWorker(cache, config, sweep_seconds=3600)
    with counting(engine) as trips:
        assert await worker.run(engine) == 7  # the first run sweeps: 3 + 3 + 1
    claims = [s for s in trips.sent if s.startswith("SELECT counted.queued_total")]
    sweeps = [s for s in trips.sent if s.startswith("SELECT DISTINCT")]
    assert len(claims) == 3, trips  # no fourth claim to find the queue empty
    assert len(sweeps) == 1, trips  # the sweep; no re-read of the queue after the last batch
    # per batch, the decisions and their bc_decided are one statement; no separate clock read
    assert len([s for s in trips.sent if s.startswith("WITH decided_rows")]) == 3, trips
    assert not [s for s in trips.sent if "pg_notify" in s and not s.startswith("WITH")], trips
    assert not [s for s in trips.sent if s.startswith("SELECT now()")], trips
    assert all(status == "placed" for status, _ in (await _statuses(engine, ids)).values())
    assert not worker._heard  # nothing left: no retry planned


async def test_rows_another_worker_holds_are_counted_and_looked_at_again(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body("h0", 8)])
    cache, config = PoolCache(), _config()
    held, free = await _queue(engine, cache, config, pool, 2)
    worker = queue.QueueWorker(cache, config, sweep_seconds=3600)
    async with engine.connect() as other:  # another replica's batch holds one queued row
        await other.execute(sa.select(reservations.c.id).where(reservations.c.id == held).with_for_update())
        assert await worker.run(engine) == 1
        assert worker._heard == {pool}  # looked at again after BUSY_RETRY
        await other.rollback()  # that replica died: its row is claimable again
    assert await worker.run(engine) == 1
    statuses = await _statuses(engine, [held, free])
    assert statuses[held][0] == statuses[free][0] == "placed"
    assert not worker._heard


async def test_the_enqueue_answers_retries_and_unknown_pools(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body("e0", 8)])
    cache, config = PoolCache(), _config()
    view, created = await queue.create(engine, cache, config, _body(pool, "k1"))
    assert created and view.status == "queued" and view.allocations == []
    again, created = await queue.create(engine, cache, config, _body(pool, "k1"))
    assert not created and again.id == view.id and again.status == "queued"
    with pytest.raises(IdempotencyKeyReused):
        await queue.create(engine, cache, config, _body(pool, "k1", gpus=2))
    with pytest.raises(NotFound):
        await queue.create(engine, cache, config, _body("pool_nope", "k2"))
    async with engine.connect() as conn:
        count = (await conn.execute(sa.select(sa.func.count()).select_from(reservations))).scalar_one()
    assert count == 1


async def test_the_one_statement_view_is_the_view_of_two_reads(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body("v0", 8)])
    cache, config = PoolCache(), _config()
    body = _body(pool, "v1", gpus=2)
    placed, _ = await create_reservation(engine, cache, config, body)
    queued, _ = await queue.create(engine, cache, config, _body(pool, "v2"))
    async with engine.connect() as conn:
        for rid in (placed.id, queued.id):
            row = (await conn.execute(sa.select(reservations).where(reservations.c.id == rid))).one()
            assert await read_view(conn, rid) == await reservation_view(conn, row)
        assert await read_view(conn, "res_nope") is None
    assert placed.status == "placed" and len(placed.allocations[0].atoms) == 2


async def test_one_replica_at_a_time_plans_a_pool(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body("l0", 8)])
    other_pool, _ = await make_pool_with_nodes(engine, [node_body("l1", 8)])
    cache, config = PoolCache(), _config()
    ids = await _queue(engine, cache, config, pool, 2)
    others = await _queue(engine, cache, config, other_pool, 1)
    worker = queue.QueueWorker(cache, config, sweep_seconds=3600)
    async with engine.begin() as holder:  # another replica's batch holds the pool's lease
        assert (await holder.execute(sa.select(locks.pool_lease(sa.literal(pool))))).scalar_one()
        assert await worker.run(engine) == 1  # the other pool only
        assert worker._heard == {pool}  # the leased pool is looked at again after BUSY_RETRY
        assert {s for s, _ in (await _statuses(engine, ids)).values()} == {"queued"}
    # the holder committed (or died): the lease is free with its transaction
    assert await worker.run(engine) == 2
    statuses = await _statuses(engine, [*ids, *others])
    assert {s for s, _ in statuses.values()} == {"placed"}
