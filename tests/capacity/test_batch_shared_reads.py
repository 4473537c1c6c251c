"""A batch's plans share their reads (issue 15; app/capacity/planning/shared_reads.py ``SharedReads``): one
exceptions read per (window, resource names, tenant) group, counted with the round-trip counter; each
plan sees the earlier plans of the batch (atoms and scalar amounts) only where the windows overlap, so
an entry that no longer fits is decided pending at plan time instead of losing a race at the commit;
what another transaction of the process assumes after the read is caught up with before each plan;
and the multi-row scalar hold whose group total no longer fits holds the entries one at a time."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.commit.lost_races import SCALAR_RAN_OUT
from app.capacity.placing.batch import BatchEntry, BatchOptions, place_batch
from app.capacity.placing.inline import Pending, Placed
from app.capacity.planning.exceptions import exceptions_statement
from app.capacity.planning.shared_reads import SharedReads
from app.capacity.planning.snapshot import PoolCache, read_pool_head
from app.db.tables import quota_holdings, scalar_holdings
from app.placement.model import DeviceRequest, PlacementRequest
from app.placement.options import SchedulerOptions
from tests.capacity.helpers import book, db_time, make_pool_with_nodes, node_body, reservation_row
from tests.round_trips import counting


def _request(
    pool: str, start: Any, hours: int = 24, gpus: int = 1, cpu: int = 2, tenant: str = "acme"
) -> Any:
    return PlacementRequest(
        tenant_id=tenant,
        pool_id=pool,
        devices=(DeviceRequest("gpu", gpus),),
        resources={"cpu": Decimal(cpu)} if cpu else {},
        start=start,
        end=start + timedelta(hours=hours),
    )


async def _entries(engine: AsyncEngine, pool: str, requests: list[PlacementRequest]) -> list[BatchEntry]:
    async with engine.begin() as conn:
        ids = [await reservation_row(conn, pool, r.tenant_id) for r in requests]
    return [
        BatchEntry(rid, r, {"gpu": Decimal(sum(d.count for d in r.devices)), **dict(r.resources)})
        for rid, r in zip(ids, requests, strict=True)
    ]


def _exception_reads(sent: list[str], dialect: Any) -> int:
    """How many of the counted statements are the shortlist's exceptions read (either variant)."""
    heads = {" ".join(exceptions_statement(v).compile(dialect)[0].split())[:160] for v in (False, True)}
    return sum(1 for s in sent if s in heads)


async def test_one_exceptions_read_per_batch_group(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body(f"n{i}", 8, cpu=64) for i in range(8)])
    start = await db_time(engine)
    later = start + timedelta(days=3)
    requests = [_request(pool, start) for _ in range(36)]  # one window, one tenant: one group
    requests += [_request(pool, later) for _ in range(4)]  # another window: a second group
    requests += [_request(pool, start, tenant="other") for _ in range(4)]  # another tenant: a third
    requests += [_request(pool, start, cpu=0) for _ in range(4)]  # no resources: a fourth
    entries = await _entries(engine, pool, requests)
    cache = PoolCache()
    async with engine.connect() as conn:  # the pool cache loaded (six statements) before counting
        await cache.inventory(conn, await read_pool_head(conn, pool))
    with counting(engine) as trips:
        async with engine.begin() as conn:
            await place_batch(conn, cache, BatchOptions(SchedulerOptions(), 3), pool, entries)
    assert all(isinstance(e.outcome, Placed) and not e.lost for e in entries), [e.outcome for e in entries]
    assert _exception_reads(trips.sent, engine.dialect) == 4, trips
    # no statement per entry: 48 entries take fewer round trips than entries (the batch's statements,
    # a scalar read per group, the quota rows' first charge)
    assert trips.count < len(entries), str(trips)


async def test_overlapping_windows_see_each_other_far_apart_ones_do_not(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body("only", 2, cpu=16)])
    start = await db_time(engine)
    far = start + timedelta(days=10)
    requests = [
        _request(pool, start, gpus=2, cpu=2),  # takes both GPUs over [start, +24h)
        _request(pool, start + timedelta(hours=12), gpus=2, cpu=2),  # overlaps: nothing left
        _request(pool, far, gpus=2, cpu=2),  # far apart: both GPUs are free then
    ]
    entries = await _entries(engine, pool, requests)
    async with engine.begin() as conn:
        await place_batch(conn, PoolCache(), BatchOptions(SchedulerOptions(), 3), pool, entries)
    first, overlapping, far_apart = entries
    assert isinstance(first.outcome, Placed) and isinstance(far_apart.outcome, Placed)
    assert isinstance(overlapping.outcome, Pending), overlapping.outcome
    assert not overlapping.lost  # decided at plan time: the batch's own plan was seen, not raced
    [a] = first.outcome.allocations
    [c] = far_apart.outcome.allocations
    assert sorted(a.atoms) == sorted(c.atoms)


async def test_earlier_scalar_holdings_of_the_batch_are_seen_where_windows_overlap(
    clean_db: AsyncEngine,
) -> None:
    engine = clean_db
    pool, _ = await make_pool_with_nodes(engine, [node_body("only", 8, cpu=8)])
    start = await db_time(engine)
    requests = [
        _request(pool, start, cpu=6),
        _request(pool, start + timedelta(hours=6), cpu=6),  # overlaps: 6 + 6 > 8 cpu
        _request(pool, start + timedelta(days=5), cpu=6),  # far apart: room again
        _request(pool, start, cpu=2),  # same window: 6 + 2 fits exactly
    ]
    entries = await _entries(engine, pool, requests)
    async with engine.begin() as conn:
        await place_batch(conn, PoolCache(), BatchOptions(SchedulerOptions(), 3), pool, entries)
    first, overlapping, far_apart, small = entries
    assert isinstance(overlapping.outcome, Pending) and not overlapping.lost, (
        overlapping.outcome,
        overlapping.lost,
    )
    assert "cpu" in overlapping.outcome.reason
    for e in (first, far_apart, small):
        assert isinstance(e.outcome, Placed) and not e.lost, (e.outcome, e.lost)
    async with engine.connect() as conn:
        held = (await conn.execute(sa.select(sa.func.sum(scalar_holdings.c.amount)))).scalar_one()
        charged = (await conn.execute(sa.select(sa.func.count()).select_from(quota_holdings))).scalar_one()
    assert held == 14
    assert charged == 6  # gpu and cpu of each placed entry, in one statement


async def test_a_shared_read_catches_up_with_later_assumptions(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, views = await make_pool_with_nodes(engine, [node_body("only", 4, cpu=16)])
    start = await db_time(engine)
    request = _request(pool, start)
    cache = PoolCache()
    async with engine.connect() as conn:
        head = await read_pool_head(conn, pool)
        await cache.inventory(conn, head)
        shared = SharedReads(cache, head, [request])
        _, before = await shared.exceptions(conn, request)
        assert not before.booked
        # another transaction of this process plans two atoms after the read
        atoms = [a.id for a in (await cache.inventory(conn, head)).nodes[views[0].id].atoms[:2]]
        cache.assume(pool, views[0].id, atoms, start, start + timedelta(hours=1))
        cache.assume(pool, views[0].id, ["elsewhere"], start + timedelta(days=9), start + timedelta(days=10))
        _, after = await shared.exceptions(conn, request)
        assert after.booked == {views[0].id: set(atoms)}
        assert shared.reads == 1


async def test_a_scalar_group_that_no_longer_fits_holds_one_at_a_time(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, views = await make_pool_with_nodes(engine, [node_body("only", 8, cpu=16)])
    node_id = views[0].id
    start = await db_time(engine)
    entries = await _entries(engine, pool, [_request(pool, start, cpu=6) for _ in range(2)])

    async def race(attempt: int, _candidates: Any) -> None:
        if attempt == 1:  # another transaction holds 6 cpu meanwhile: 6 + 6 + 6 > 16, 6 + 6 fits
            async with engine.begin() as conn:
                await book(conn, pool, node_id, [], start, start + timedelta(hours=24), {"cpu": 6})

    async with engine.begin() as conn:
        opts = BatchOptions(SchedulerOptions(), 3, before_commit=race)
        await place_batch(conn, PoolCache(), opts, pool, entries)
    placed = [e for e in entries if isinstance(e.outcome, Placed)]
    assert len(placed) == 1 and not placed[0].lost  # the first held alone, not the group refused whole
    [loser] = [e for e in entries if e not in placed]
    assert [r.kind for r in loser.lost] == [SCALAR_RAN_OUT]
    assert isinstance(loser.outcome, Pending)
