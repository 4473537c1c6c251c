"""The invariants sweep (tests/capacity/invariants.py) is not vacuous: a consistent placed reservation
passes every check, and each check reports the state that breaks it, written directly (no guard)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from decimal import Decimal

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db.tables import allocations, device_bookings, devices, quota_holdings, reservations, scalar_holdings
from app.db.windows import window
from app.ids import new_id
from app.quota.limits import set_limits
from tests.capacity.helpers import book, db_time, make_pool_with_nodes, reservation_row
from tests.capacity.invariants import CHECKS, violations
from tests.factories import node_body

NODE_CPU = 12
SPEC = {"devices": [{"class": "gpu", "count": 1}], "resources": {"cpu": 2}}


async def _placed(
    conn: AsyncConnection, pool: str, node: str, atoms: list[str], start, end
) -> tuple[str, str]:
    """A placed reservation of tenant ``t`` exactly as the guarded commit writes it: its allocation of
    ``atoms`` and 2 cpu on ``node`` over ``[start, end)``, the bookings, scalar and quota holdings;
    returns (reservation id, allocation id)."""
    res_id, alloc_id = new_id("res"), new_id("alloc")
    await conn.execute(
        sa.insert(reservations).values(
            id=res_id,
            tenant_id="t",
            pool_id=pool,
            status="placed",
            spec={**SPEC, "devices": [{"class": "gpu", "count": len(atoms)}]},
            spec_hash="-",
            idempotency_key=res_id,
            ends_at=end,
        )
    )
    await conn.execute(
        sa.insert(allocations).values(
            id=alloc_id,
            reservation_id=res_id,
            pool_id=pool,
            node_id=node,
            atoms=atoms,
            resources={"cpu": "2"},
            during=window(start, end),
        )
    )
    pks = dict(
        (await conn.execute(sa.select(devices.c.id, devices.c.pk).where(devices.c.id.in_(atoms)))).all()
    )
    for atom in atoms:
        await conn.execute(
            sa.insert(device_bookings).values(
                device_pk=pks[atom],
                device_id=atom,
                pool_id=pool,
                allocation_id=alloc_id,
                during=window(start, end),
            )
        )
    held = {"starts_at": start, "ends_at": end, "pool_id": pool}
    await conn.execute(
        sa.insert(scalar_holdings).values(
            allocation_id=alloc_id, resource="cpu", node_id=node, amount=2, **held
        )
    )
    for resource, amount in (("gpu", len(atoms)), ("cpu", 2)):
        await conn.execute(
            sa.insert(quota_holdings).values(
                reservation_id=res_id, resource=resource, tenant_id="t", amount=amount, **held
            )
        )
    return res_id, alloc_id


Breaker = Callable[[AsyncConnection, dict[str, str]], Awaitable[None]]


async def _sql(conn: AsyncConnection, statement: str, **params: object) -> None:
    await conn.execute(sa.text(statement), params)


async def _book_gpu1_for_another(conn: AsyncConnection, s: dict[str, str]) -> None:
    start, end = s["start"], s["end"]
    await book(conn, s["pool"], s["node"], [s["gpu1"]], start, end)  # type: ignore[arg-type]


async def _second_allocation(conn: AsyncConnection, s: dict[str, str]) -> None:
    await _sql(
        conn,
        "INSERT INTO allocations (id, reservation_id, pool_id, node_id, atoms, during) "
        "SELECT 'alloc_twice', reservation_id, pool_id, node_id, ARRAY[:gpu1], during FROM allocations "
        "WHERE id = :alloc",
        gpu1=s["gpu1"],
        alloc=s["alloc"],
    )


async def _lease_and_another(conn: AsyncConnection, s: dict[str, str]) -> None:
    await _sql(
        conn, """UPDATE reservations SET spec = spec || '{"binding": "node"}' WHERE id = :r""", r=s["res"]
    )
    await _book_gpu1_for_another(conn, s)


BREAKERS: dict[str, Breaker] = {
    "scalar over capacity at an instant": lambda c, s: _sql(
        c, "UPDATE node_resources SET allocatable = 1 WHERE node_id = :n", n=s["node"]
    ),
    "quota over limit at an instant": lambda c, s: set_limits(c, "t", s["pool"], {"gpu": Decimal(0)}),
    "scalar holdings != allocations": lambda c, s: _sql(c, "UPDATE scalar_holdings SET amount = 3"),
    "quota holdings != reservations": lambda c, s: _sql(
        c, "DELETE FROM quota_holdings WHERE resource = 'gpu'"
    ),
    "placed reservation without one live allocation per member": lambda c, s: _sql(
        c, "UPDATE allocations SET released_at = lower(during)"
    ),
    "pending reservation holding something": lambda c, s: _sql(
        c, "UPDATE reservations SET status = 'pending'"
    ),
    "planned window out of place": lambda c, s: _sql(c, "UPDATE allocations SET planned = true"),
    "allocation atoms != bookings": lambda c, s: _sql(c, "DELETE FROM device_bookings"),
    "booking on another node or window": lambda c, s: _sql(
        c, "UPDATE device_bookings SET during = tstzrange(lower(during), upper(during) + interval '1 hour')"
    ),
    "placed atoms != requested count": lambda c, s: _sql(
        c, """UPDATE reservations SET spec = jsonb_set(spec, '{devices,0,count}', '2')"""
    ),
    "released, ended or preempted reservation still holding": lambda c, s: _sql(
        c, "UPDATE reservations SET status = 'preempted', released_at = now()"
    ),
    "in use on an unavailable atom": lambda c, s: _sql(
        c, "UPDATE devices SET healthy = false WHERE id = :a", a=s["gpu0"]
    ),
    "lease not holding every atom of its node": lambda c, s: _sql(
        c, """UPDATE reservations SET spec = spec || '{"binding": "node"}'"""
    ),
    "leased node shared in its window": _lease_and_another,
    "reservation placed twice": _second_allocation,
}


def test_every_check_has_a_breaker() -> None:
    assert set(BREAKERS) | {"overlapping bookings"} == set(CHECKS)


async def _setup(engine: AsyncEngine) -> dict[str, str]:
    pool, [view] = await make_pool_with_nodes(engine, [node_body("inv", 2, cpu=NODE_CPU)])
    start = (await db_time(engine)) + timedelta(minutes=1)
    end = start + timedelta(hours=1)
    gpu0, gpu1 = "inv-GPU0", "inv-GPU1"
    async with engine.begin() as conn:
        res, alloc = await _placed(conn, pool, view.id, [gpu0], start, end)
    return {
        "pool": pool,
        "node": view.id,
        "res": res,
        "alloc": alloc,
        "gpu0": gpu0,
        "gpu1": gpu1,
        "start": start,
        "end": end,
    }  # type: ignore[dict-item]


@pytest.mark.parametrize("name", sorted(BREAKERS))
async def test_each_check_reports_the_state_that_breaks_it(clean_db: AsyncEngine, name: str) -> None:
    engine = clean_db
    setup = await _setup(engine)
    assert await violations(engine) == {}  # the consistent books pass every check
    async with engine.begin() as conn:
        await BREAKERS[name](conn, setup)
    found = await violations(engine)
    assert name in found, found


async def test_overlapping_bookings_are_reported(clean_db: AsyncEngine) -> None:
    """The exclusion constraint forbids the double booking; without it (dropped in a transaction rolled
    back after), the check reports it."""
    engine = clean_db
    setup = await _setup(engine)
    async with engine.connect() as conn:
        await conn.exec_driver_sql("ALTER TABLE device_bookings DROP CONSTRAINT ex_device_bookings_overlap")
        await book(conn, setup["pool"], setup["node"], [setup["gpu0"]], setup["start"], setup["end"])  # type: ignore[arg-type]
        rows = (await conn.exec_driver_sql(CHECKS["overlapping bookings"])).all()
        await conn.rollback()
    assert [r[0] for r in rows] == [setup["gpu0"]]


async def test_the_sweep_finds_an_overcommit_at_one_instant(clean_db: AsyncEngine) -> None:
    """The per-instant checks are not vacuous: holdings written without the guard that overlap by one
    second on a 12-cpu node (7 + 6), and a tenant's 2 + 1 GPUs over a limit of 2 in that second, are found
    at exactly that instant; holdings that only touch (6 + 6 from the next instant on) are not."""
    engine = clean_db
    pool, [view] = await make_pool_with_nodes(engine, [node_body("sweep", 4, cpu=NODE_CPU)])
    t = await db_time(engine)
    hour, second = timedelta(hours=1), timedelta(seconds=1)
    async with engine.begin() as conn:
        await set_limits(conn, "t", pool, {"gpu": 2})
        for cpu, start, end in (
            (7, t, t + hour),
            (6, t + hour, t + 2 * hour),
            (6, t + hour - second, t + 3 * hour),
        ):
            await book(conn, pool, view.id, [], start, end, resources={"cpu": cpu})
        for gpus, start, end in ((2, t, t + hour), (1, t + hour - second, t + 2 * hour)):
            res = await reservation_row(conn, pool, tenant="t")
            await conn.execute(
                sa.insert(quota_holdings).values(
                    reservation_id=res,
                    resource="gpu",
                    tenant_id="t",
                    pool_id=pool,
                    amount=gpus,
                    starts_at=start,
                    ends_at=end,
                )
            )
    found = await violations(engine)
    assert [(r[2], r[3]) for r in found["scalar over capacity at an instant"]] == [(t + hour - second, 13)]
    assert [(r[2], r[3]) for r in found["quota over limit at an instant"]] == [(t + hour - second, 3)]
