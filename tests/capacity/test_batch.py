"""The batch placer (issue 15; app/capacity/placing/batch.py and app/capacity/queue/worker.py) on real
PostgreSQL:
each plan of a batch sees the earlier ones, the multi-row guarded commit loses each of
docs/placement-rules.md's races
per entry and replans the loser alone, maxAttempts, quota refusals per entry, and a queued reservation
is never placed into a pool archived after it was queued."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.config import CapacityConfig
from app.capacity.placing.batch import BatchEntry, BatchOptions, place_batch
from app.capacity.placing.inline import Pending, Placed
from app.capacity.planning.snapshot import PoolCache
from app.capacity.queue import worker as queue
from app.db.tables import device_bookings, quota_holdings, reservations, scalar_holdings
from app.inventory import service as inventory
from app.placement.model import DeviceRequest, PlacementRequest
from app.placement.options import SchedulerOptions
from app.placement.request import ReservationRequest
from app.placement.summary import ARCHIVED_POOL
from app.quota.limits import set_limits
from tests.capacity.helpers import day_after, db_time, make_pool_with_nodes, node_body, reservation_row
from tests.capacity.test_lost_races import CASES, RACES_ON_OTHER_NODES, _setup


def _request(pool: str, start: Any, gpus: int = 2, cpu: int = 4, tenant: str = "acme") -> PlacementRequest:
    return PlacementRequest(
        tenant_id=tenant,
        pool_id=pool,
        devices=(DeviceRequest("gpu", gpus),) if gpus else (),
        resources={"cpu": Decimal(cpu)} if cpu else {},
        start=start,
        end=day_after(start),
        node_labels={"bc.dev/driver.kvm": "*"},
    )


async def _entries(engine: AsyncEngine, pool: str, requests: list[PlacementRequest]) -> list[BatchEntry]:
    async with engine.begin() as conn:
        ids = [await reservation_row(conn, pool, r.tenant_id) for r in requests]
    return [
        BatchEntry(rid, r, {"gpu": Decimal(sum(d.count for d in r.devices)), **dict(r.resources)})
        for rid, r in zip(ids, requests, strict=True)
    ]


async def _bookings_of(engine: AsyncEngine, allocation_id: str) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.select(device_bookings.c.device_id).where(device_bookings.c.allocation_id == allocation_id)
        )
        return sorted(rows.scalars())


async def test_each_plan_of_a_batch_sees_the_earlier_ones(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, names = await _setup(engine, 2)  # 2 nodes x 4 GPUs, 16 cpu each
    start = await db_time(engine)
    entries = await _entries(engine, pool, [_request(pool, start, 1, 4) for _ in range(8)])
    cache = PoolCache()
    async with engine.begin() as conn:
        await place_batch(conn, cache, BatchOptions(SchedulerOptions(), 3), pool, entries)
    assert all(isinstance(e.outcome, Placed) for e in entries), [e.outcome for e in entries]
    assert all(not e.lost for e in entries)  # no entry lost a race against an earlier one
    atoms = [a for e in entries for c in e.outcome.allocations for a in c.atoms]  # type: ignore[union-attr]
    assert len(atoms) == len(set(atoms)) == 8
    for e in entries:
        [c] = e.outcome.allocations  # type: ignore[union-attr]
        assert await _bookings_of(engine, c.allocation_id) == sorted(c.atoms)
    # a ninth entry finds the pool full, sees the batch's own writes and goes pending
    [ninth] = await _entries(engine, pool, [_request(pool, start, 1, 0)])
    async with engine.begin() as conn:
        await place_batch(conn, cache, BatchOptions(SchedulerOptions(), 3), pool, [ninth])
    assert isinstance(ninth.outcome, Pending) and "fits" in ninth.outcome.reason


@pytest.mark.parametrize(("case", "spoil", "reason"), CASES, ids=[c[0] for c in CASES])
async def test_a_lost_race_replans_only_the_loser(
    clean_db: AsyncEngine, case: str, spoil: Any, reason: str
) -> None:
    engine = clean_db
    pool, names = await _setup(engine, 3)
    start = await db_time(engine)
    entries = await _entries(engine, pool, [_request(pool, start), _request(pool, start)])
    spoiled: list[str] = []

    async def hook(attempt: int, candidates: list[Any]) -> None:
        if attempt == 1:  # spoil the first entry's node only
            spoiled.append(candidates[0].node_id)
            await spoil(engine, pool, candidates[0].node_id, list(candidates[0].atoms), start)

    opts = BatchOptions(SchedulerOptions(), 3, before_commit=hook)
    async with engine.begin() as conn:
        await place_batch(conn, PoolCache(), opts, pool, entries)
    first, second = entries
    assert isinstance(first.outcome, Placed) and isinstance(second.outcome, Placed), entries
    assert [r.reason for r in first.lost] == [reason.format(name=names[spoiled[0]])]
    if first.lost[0].kind in ("not_schedulable", "atom_unhealthy"):
        assert first.outcome.allocations[0].node_id != spoiled[0]
    for e in entries:
        [c] = e.outcome.allocations  # type: ignore[union-attr]
        assert await _bookings_of(engine, c.allocation_id) == sorted(c.atoms)
    async with engine.connect() as conn:  # nothing of the loser's first attempt survived
        held = (
            await conn.execute(
                sa.select(sa.func.count())
                .select_from(scalar_holdings)
                .where(
                    scalar_holdings.c.allocation_id.not_in(
                        [e.outcome.allocations[0].allocation_id for e in entries]  # type: ignore[union-attr]
                    ),
                    scalar_holdings.c.amount == 4,
                )
            )
        ).scalar_one()
        assert held == 0


@pytest.mark.parametrize(
    ("case", "spoil", "reason"), RACES_ON_OTHER_NODES, ids=[c[0] for c in RACES_ON_OTHER_NODES]
)
async def test_max_attempts_ends_pending_with_every_reason_and_refunds(
    clean_db: AsyncEngine, case: str, spoil: Any, reason: str
) -> None:
    engine = clean_db
    pool, names = await _setup(engine, 3)
    start = await db_time(engine)
    [entry] = await _entries(engine, pool, [_request(pool, start)])
    order: list[str] = []

    async def hook(attempt: int, candidates: list[Any]) -> None:
        order.append(candidates[0].node_id)
        await spoil(engine, pool, candidates[0].node_id, list(candidates[0].atoms), start)

    async with engine.begin() as conn:
        await place_batch(
            conn, PoolCache(), BatchOptions(SchedulerOptions(), 3, before_commit=hook), pool, [entry]
        )
    assert isinstance(entry.outcome, Pending)
    expected = "; ".join(reason.format(name=names[n]) for n in order)
    assert entry.outcome.reason == f"Unschedulable after 3 conflicting attempts: {expected}"
    async with engine.connect() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(quota_holdings))).scalar_one() == 0


async def test_a_refused_charge_refuses_that_entry_alone(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await _setup(engine, 2)
    async with engine.begin() as conn:
        await set_limits(conn, "poor", pool, {"gpu": Decimal(1)})
    start = await db_time(engine)
    entries = await _entries(
        engine, pool, [_request(pool, start, 2, 0, "poor"), _request(pool, start, 2, 0, "rich")]
    )
    async with engine.begin() as conn:
        await place_batch(conn, PoolCache(), BatchOptions(SchedulerOptions(), 3), pool, entries)
    poor, rich = entries
    assert poor.refused is not None and poor.outcome is None and isinstance(rich.outcome, Placed)
    async with engine.connect() as conn:
        tenants = (await conn.execute(sa.select(quota_holdings.c.reservation_id))).scalars().all()
    assert tenants == [rich.reservation_id]


async def _queue(
    engine: AsyncEngine, cache: PoolCache, config: CapacityConfig, pool: str, n: int
) -> list[str]:
    ids = []
    for i in range(n):
        body = ReservationRequest.model_validate(
            {
                "tenantId": "acme",
                "poolId": pool,
                "devices": [{"class": "gpu", "count": 1}],
                "duration": "1h",
                "idempotencyKey": f"q-{pool}-{i}",
            }
        )
        view, created = await queue.create(engine, cache, config, body)
        assert created and view.status == "queued"
        ids.append(view.id)
    return ids


async def _statuses(engine: AsyncEngine, ids: list[str]) -> dict[str, tuple[str, Any]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.select(reservations.c.id, reservations.c.status, reservations.c.conditions).where(
                reservations.c.id.in_(ids)
            )
        )
        return {r.id: (r.status, r.conditions) for r in rows}


async def test_the_worker_decides_queued_work_oldest_first_in_batches(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body("w0", 4), node_body("w1", 4)])
    cache = PoolCache()
    config = replace(CapacityConfig(SchedulerOptions()), placer="pool-lease", max_batch=3)
    ids = await _queue(engine, cache, config, pool, 10)
    assert await queue.work_batch(engine, cache, config, pool) == 3
    statuses = await _statuses(engine, ids)
    assert [statuses[i][0] for i in ids[:4]] == ["placed", "placed", "placed", "queued"]  # oldest first
    worker = queue.QueueWorker(cache, config, sweep_seconds=3600)
    assert await worker.run(engine) == 7  # the first run sweeps every pool with queued work
    statuses = await _statuses(engine, ids)
    assert [statuses[i][0] for i in ids] == ["placed"] * 8 + ["pending"] * 2
    assert await worker.run(engine) == 0  # idle: nothing heard, the sweep not due


async def test_a_queued_reservation_is_not_placed_into_a_pool_archived_after(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body("a0", 4)])
    cache = PoolCache()
    config = replace(CapacityConfig(SchedulerOptions()), placer="pool-lease")
    ids = await _queue(engine, cache, config, pool, 2)
    async with engine.begin() as conn:
        await inventory.archive_pool(conn, pool)
    assert await queue.work_batch(engine, cache, config, pool) == 2
    for status, conditions in (await _statuses(engine, ids)).values():
        assert status == "pending" and conditions[0]["message"] == ARCHIVED_POOL
    async with engine.connect() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(quota_holdings))).scalar_one() == 0
        assert (await conn.execute(sa.select(sa.func.count()).select_from(device_bookings))).scalar_one() == 0
