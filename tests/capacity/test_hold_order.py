"""The inline placer's hold of the node it lost a race on keeps the lock order (nodes in id order,
docs/architecture.md "Lock order"; app/capacity/placing/inline.py, NodeHold).

Two placers on two connections each lose their first commit on one node and replan on the other one.
Before the fix each kept the node it lost on locked ``FOR UPDATE`` while it committed on the other: the
two waited on each other (deadlock detected, 40P01, after ``deadlock_timeout``), and a health write
queued on one of those nodes was caught in such cycles in the two-server stress test
(tests/capacity/test_stress.py: ``POST /v1/nodes/{id}/health`` answered 500). Now the node lost on is
let go when the replan commits elsewhere, and kept when the replan commits on it again (a retry there
cannot lose a second race).
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from decimal import Decimal

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.placing.inline import Pending, Placed, place_inline
from app.capacity.planning.snapshot import PoolCache
from app.db.tables import allocations, nodes, scalar_holdings
from app.db.tx import sqlstate
from app.placement.model import Candidate, DeviceRequest, PlacementRequest
from app.placement.options import SchedulerOptions
from tests.capacity.helpers import book, day_after, db_time, make_pool_with_nodes, reservation_row
from tests.factories import node_body

LOCK_NOT_AVAILABLE = "55P03"


async def _take_all_cpu(engine: AsyncEngine, pool: str, node_id: str, start: datetime) -> str:
    """Another holder takes the node's 16 cpu over the window (committed); returns its allocation."""
    async with engine.begin() as other:
        return await book(other, pool, node_id, [], start, day_after(start), resources={"cpu": 16})


async def _give_back(engine: AsyncEngine, alloc_id: str) -> None:
    async with engine.begin() as other:
        await other.execute(sa.delete(scalar_holdings).where(scalar_holdings.c.allocation_id == alloc_id))
        await other.execute(sa.delete(allocations).where(allocations.c.id == alloc_id))


async def _locked_by_someone(engine: AsyncEngine, node_id: str) -> bool:
    """Whether another transaction holds the node row (``SELECT ... FOR UPDATE NOWAIT`` is refused)."""
    async with engine.connect() as probe:
        try:
            # SELECT id FROM nodes WHERE id = :node FOR UPDATE NOWAIT
            stmt = sa.select(nodes.c.id).where(nodes.c.id == node_id).with_for_update(nowait=True)
            await probe.execute(stmt)
        except DBAPIError as exc:
            if sqlstate(exc) != LOCK_NOT_AVAILABLE:
                raise
            return True
        finally:
            await probe.rollback()
    return False


def _cpu_request(pool: str, start: datetime) -> PlacementRequest:
    return PlacementRequest(
        tenant_id="acme", pool_id=pool, resources={"cpu": Decimal(4)}, start=start, end=day_after(start)
    )


async def test_two_placers_replanning_on_each_others_lost_node_do_not_deadlock(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, views = await make_pool_with_nodes(engine, [node_body(f"n{i}", 1, cpu=16) for i in range(2)])
    names = {v.id: v.name for v in views}
    start = await db_time(engine)
    lost_first: dict[str, str] = {}  # placer -> the node its first commit lost on
    spoilers: dict[str, str] = {}  # node -> the allocation holding all its cpu
    held_while_elsewhere: list[bool] = []
    first_replanned, go = asyncio.Event(), asyncio.Event()

    async def first_hook(attempt: int, candidate: Candidate) -> None:
        if attempt == 1:  # lose on this node: its cpu runs out before the commit
            lost_first["first"] = candidate.node_id
            spoilers[candidate.node_id] = await _take_all_cpu(engine, pool, candidate.node_id, start)
            return
        # the replan chose the other node; the one lost on must not stay locked meanwhile
        held_while_elsewhere.append(await _locked_by_someone(engine, lost_first["first"]))
        first_replanned.set()
        await go.wait()  # commit together with the second placer

    async def second_hook(attempt: int, candidate: Candidate) -> None:
        if attempt == 1:  # it plans on the first placer's next node (its first node is full): lose there
            lost_first["second"] = candidate.node_id
            spoilers[candidate.node_id] = await _take_all_cpu(engine, pool, candidate.node_id, start)
            await _give_back(engine, spoilers.pop(lost_first["first"]))  # the first node has room again
            return
        go.set()  # both commit now: each on the node the other lost on

    async def place(hook: object, wait_for: asyncio.Event | None) -> Placed | Pending:
        if wait_for is not None:
            await wait_for.wait()
        async with engine.begin() as conn:
            res = await reservation_row(conn, pool)
            return await place_inline(
                conn, PoolCache(), _cpu_request(pool, start), res, SchedulerOptions(), 2, before_commit=hook
            )

    first, second = await asyncio.wait_for(
        asyncio.gather(place(first_hook, None), place(second_hook, first_replanned)), timeout=30
    )

    n_first, n_second = lost_first["first"], lost_first["second"]
    assert n_first != n_second
    assert held_while_elsewhere == [False]
    # the second placer placed on the node the first lost on; the first lost its replan fairly (the
    # cpu of its new node ran out), not as a deadlock's victim (which reads "booked concurrently")
    assert isinstance(second, Placed), second
    assert [a.node_id for a in second.allocations] == [n_first]
    assert isinstance(first, Pending), first
    assert first.reason == (
        f"Unschedulable after 2 conflicting attempts: cpu on {names[n_first]} ran out; "
        f"cpu on {names[n_second]} ran out"
    ), first.reason


async def test_a_replan_on_the_node_lost_on_keeps_it_held(clean_db: AsyncEngine) -> None:
    engine = clean_db
    pool, [view] = await make_pool_with_nodes(engine, [node_body("n0", 2, cpu=16)])
    start = await db_time(engine)
    held_at_retry: list[bool] = []

    async def hook(attempt: int, candidate: Candidate) -> None:
        if attempt == 1:  # another commit books the picked GPU: an atom booked concurrently
            async with engine.begin() as other:
                await book(other, pool, candidate.node_id, [candidate.atoms[0]], start, day_after(start))
        else:  # the replan chose the node again (its other GPU): nobody else may book there meanwhile
            held_at_retry.append(await _locked_by_someone(engine, candidate.node_id))

    request = PlacementRequest(
        tenant_id="acme", pool_id=pool, devices=(DeviceRequest("gpu", 1),), start=start, end=day_after(start)
    )
    async with engine.begin() as conn:
        res = await reservation_row(conn, pool)
        outcome = await place_inline(
            conn, PoolCache(), request, res, SchedulerOptions(), 3, before_commit=hook
        )
    assert isinstance(outcome, Placed), outcome
    assert [a.node_id for a in outcome.allocations] == [view.id]
    assert held_at_retry == [True]
