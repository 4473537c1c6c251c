"""Each of docs/placement-rules.md's four lost-race reasons, forced deterministically: a second connection
changes the
row between the plan and the commit; the placer rolls back to the savepoint, excludes the node and
replans; after maxAttempts the answer is pending with every reason (issue 4, "Done when" 2)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.placing.inline import Pending, Placed, place_inline
from app.capacity.planning.snapshot import PoolCache
from app.db.tables import device_bookings, node_labels, scalar_holdings
from app.inventory import service as inventory
from app.inventory.schemas import HealthBody
from app.placement.model import DeviceRequest, PlacementRequest
from app.placement.options import SchedulerOptions
from tests.capacity.helpers import book, day_after, db_time, make_pool_with_nodes, reservation_row
from tests.factories import node_body


async def _spoil_schedulable(engine: AsyncEngine, pool: str, node_id: str, atoms: Any, start: Any) -> None:
    async with engine.begin() as other:
        await inventory.set_cordon(other, node_id, True)


async def _spoil_health(engine: AsyncEngine, pool: str, node_id: str, atoms: Any, start: Any) -> None:
    async with engine.begin() as other:
        await inventory.set_health(
            other, node_id, HealthBody.model_validate({"devices": [{"id": atoms[0], "healthy": False}]})
        )


async def _spoil_booking(engine: AsyncEngine, pool: str, node_id: str, atoms: Any, start: Any) -> None:
    async with engine.begin() as other:
        await book(other, pool, node_id, [atoms[-1]], start, day_after(start))


async def _spoil_scalar(engine: AsyncEngine, pool: str, node_id: str, atoms: Any, start: Any) -> None:
    async with engine.begin() as other:  # another holder took all 16 cpu over the window
        await book(other, pool, node_id, [], start, day_after(start), resources={"cpu": 16})


async def _spoil_label(engine: AsyncEngine, pool: str, node_id: str, atoms: Any, start: Any) -> None:
    async with engine.begin() as other:
        await other.execute(
            sa.delete(node_labels).where(
                node_labels.c.node_id == node_id, node_labels.c.key == "bc.dev/driver.kvm"
            )
        )


CASES = [
    ("schedulable", _spoil_schedulable, "{name} is no longer schedulable"),
    ("health", _spoil_health, "an atom on {name} turned unhealthy or unbookable"),
    ("booking", _spoil_booking, "an atom on {name} was booked concurrently"),
    ("scalar", _spoil_scalar, "cpu on {name} ran out"),
    ("label", _spoil_label, "{name} is no longer schedulable"),
]


async def _setup(engine: AsyncEngine, nodes: int) -> tuple[str, dict[str, str]]:
    bodies = [node_body(f"n{i}", 4, cpu=16) for i in range(nodes)]
    pool, views = await make_pool_with_nodes(engine, bodies)
    async with engine.begin() as conn:
        for v in views:  # a system label, as a daemon's Hello would write it
            await conn.execute(
                sa.insert(node_labels).values(
                    node_id=v.id, key="bc.dev/driver.kvm", value="9", source="system"
                )
            )
            await inventory.bump_inventory_version(conn, pool)
    return pool, {v.id: v.name for v in views}


def _request(pool: str, start: Any) -> PlacementRequest:
    return PlacementRequest(
        tenant_id="acme",
        pool_id=pool,
        devices=(DeviceRequest("gpu", 2),),
        resources={"cpu": Decimal(4)},
        start=start,
        end=day_after(start),
        node_labels={"bc.dev/driver.kvm": "*"},
    )


@pytest.mark.parametrize(("case", "spoil", "reason"), CASES, ids=[c[0] for c in CASES])
async def test_a_lost_race_replans_on_another_node(
    clean_db: AsyncEngine, case: str, spoil: Any, reason: str
) -> None:
    engine = clean_db
    pool, names = await _setup(engine, 2)
    start = await db_time(engine)
    spoiled: list[str] = []
    spoiled_atoms: list[str] = []

    async def hook(attempt: int, candidate: Any) -> None:
        if attempt == 1:
            spoiled.append(candidate.node_id)
            spoiled_atoms.append(candidate.atoms[-1])
            await spoil(engine, pool, candidate.node_id, list(candidate.atoms), start)

    async with engine.begin() as conn:
        res = await reservation_row(conn, pool)
        outcome = await place_inline(
            conn, PoolCache(), _request(pool, start), res, SchedulerOptions(), 3, before_commit=hook
        )
    assert isinstance(outcome, Placed), outcome
    [alloc] = outcome.allocations
    if case == "booking":  # the node still has room: the replan re-read it and may choose it again
        assert spoiled_atoms[0] not in alloc.atoms
    else:  # excluded (no longer schedulable, atom unhealthy) or no room left after the fresh read
        assert alloc.node_id != spoiled[0]
    async with engine.connect() as conn:
        mine = (
            (
                await conn.execute(
                    sa.select(device_bookings.c.device_id).where(
                        device_bookings.c.allocation_id == alloc.allocation_id
                    )
                )
            )
            .scalars()
            .all()
        )
        assert sorted(mine) == sorted(alloc.atoms)
        # nothing of the rolled-back attempt survived on the spoiled node
        cpu = (
            await conn.execute(
                sa.select(sa.func.coalesce(sa.func.sum(scalar_holdings.c.amount), 0)).where(
                    scalar_holdings.c.node_id == spoiled[0], scalar_holdings.c.resource == "cpu"
                )
            )
        ).scalar_one()
        ours = Decimal(4) if alloc.node_id == spoiled[0] else Decimal(0)  # the retry chose it again
        assert cpu == (Decimal(16) if case == "scalar" else ours)


# an atom race is lost on a node once at most: the retry holds the node (FOR UPDATE) while it re-reads it
RACES_ON_OTHER_NODES = [c for c in CASES if c[0] != "booking"]


@pytest.mark.parametrize(
    ("case", "spoil", "reason"), RACES_ON_OTHER_NODES, ids=[c[0] for c in RACES_ON_OTHER_NODES]
)
async def test_three_lost_races_end_pending_with_every_reason(
    clean_db: AsyncEngine, case: str, spoil: Any, reason: str
) -> None:
    engine = clean_db
    pool, names = await _setup(engine, 3)
    start = await db_time(engine)
    order: list[str] = []

    async def hook(attempt: int, candidate: Any) -> None:
        order.append(candidate.node_id)
        await spoil(engine, pool, candidate.node_id, list(candidate.atoms), start)

    async with engine.begin() as conn:
        res = await reservation_row(conn, pool)
        outcome = await place_inline(
            conn, PoolCache(), _request(pool, start), res, SchedulerOptions(), 3, before_commit=hook
        )
    assert isinstance(outcome, Pending)
    assert len(set(order)) == 3  # excluded, or (scalar) no room left: each replan chose another node
    expected = "; ".join(reason.format(name=names[n]) for n in order)
    assert outcome.reason == f"Unschedulable after 3 conflicting attempts: {expected}"


async def test_a_node_binding_commits_with_the_lease_rule(clean_db: AsyncEngine) -> None:
    """binding 'node' plans with the lease rule (a cordoned node is still leasable); the commit locks
    with the same rule (leasable_sql_for), so the plan is not lost as 'no longer schedulable'."""
    engine = clean_db
    pool, views = await make_pool_with_nodes(engine, [node_body("lease0", 2, cpu=16)])
    async with engine.begin() as conn:
        await inventory.set_cordon(conn, views[0].id, True)
    start = await db_time(engine)
    request = PlacementRequest(
        tenant_id="acme",
        pool_id=pool,
        devices=(DeviceRequest("gpu", 2),),
        start=start,
        end=day_after(start),
        binding="node",
    )
    async with engine.begin() as conn:
        res = await reservation_row(conn, pool)
        outcome = await place_inline(conn, PoolCache(), request, res, SchedulerOptions(), 3)
    assert isinstance(outcome, Placed), outcome
