"""The reservations' one authorization and not-found rule (app/capacity/reservations/access.py) on real
PostgreSQL,
and the unit of work of a service entry point (app/db/tx.py): given the engine it commits or rolls back
by itself, given a connection it joins the caller's transaction."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.reservations.access import authorized_reservation_tenant
from app.db.tables import pools
from app.errors import Conflict, Forbidden, NotFound
from app.iam.authorize import Grant, Principal
from app.inventory import service as inventory
from tests.capacity.helpers import make_pool_with_nodes, reservation_row

READ = "compute:reservations:read"


def key(*grants: tuple[str, str], tenant: str | None = None) -> Principal:
    return Principal(id="p", name="p", tenant_id=tenant, grants=tuple(Grant(a, r) for a, r in grants))


async def test_a_reservation_exists_only_for_its_tenant(clean_db: AsyncEngine) -> None:
    pool, _ = await make_pool_with_nodes(clean_db, [])
    async with clean_db.begin() as conn:
        res = await reservation_row(conn, pool, tenant="acme")
    own = key((READ, "tenant:acme"), tenant="acme")
    assert await authorized_reservation_tenant(clean_db, own, res, READ) == "acme"
    assert await authorized_reservation_tenant(clean_db, key(("*", "*")), res, READ) == "acme"
    for principal, rid in ((key(("*", "*"), tenant="globex"), res), (own, "res_nothing")):
        with pytest.raises(NotFound) as error:
            await authorized_reservation_tenant(clean_db, principal, rid, READ)
        assert error.value.message == f"reservation '{rid}' not found"
    with pytest.raises(Forbidden):  # visible, but the action is not granted on tenant:acme
        await authorized_reservation_tenant(clean_db, key((READ, "tenant:globex")), res, READ)


async def test_an_entry_point_given_the_engine_is_its_own_unit_of_work(clean_db: AsyncEngine) -> None:
    created = await inventory.create_pool(clean_db, "committed")
    async with clean_db.connect() as conn:  # another connection sees it: committed
        assert (await conn.execute(sa.select(pools.c.name).where(pools.c.id == created.id))).scalar() == (
            "committed"
        )
    with pytest.raises(Conflict):  # raises: nothing of it stays
        await inventory.create_pool(clean_db, "committed")
    assert (await inventory.get_pool(clean_db, created.id)).name == "committed"


async def test_an_entry_point_given_a_connection_joins_its_transaction(clean_db: AsyncEngine) -> None:
    async with clean_db.connect() as conn:
        trans = await conn.begin()
        pool = await inventory.create_pool(conn, "joined")
        assert (await inventory.get_pool(conn, pool.id)).name == "joined"
        await trans.rollback()
    with pytest.raises(NotFound):  # rolled back with the caller's transaction
        await inventory.get_pool(clean_db, pool.id)
