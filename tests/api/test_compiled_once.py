"""A warm inline reserve builds and compiles no statement (issue 15): every statement on the create path
is a Core construct compiled once and run prepared (:class:`app.db.prepared.Prepared`), so a second
reserve neither generates a cache key nor compiles; a Core statement run through ``conn.execute``
(built per call, its cache key generated per call) shows up here by its SQL."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import event

from app.capacity.commit.single import lock_statement, write_statement
from app.capacity.reservations.create import INSERT_RESERVATION
from tests.factories import add_node, gpu_node, make_pool, reservation


async def _reserve(client: httpx.AsyncClient, pool: str) -> None:
    r = await client.post("/v1/reservations", json=reservation(pool, 1, resources={"cpu": 2}))
    assert r.status_code == 201 and r.json()["status"] == "placed", r.text


async def test_a_warm_inline_reserve_runs_no_core_statement(
    app: Any, admin_client: httpx.AsyncClient
) -> None:
    pool = await make_pool(admin_client)
    for name in ("a", "b", "c"):
        await add_node(admin_client, pool, gpu_node(name))
    for _ in range(2):  # warm: the pool cache is loaded, the statements compiled
        await _reserve(admin_client, pool)
    compiled_before = lock_statement.cache_info().currsize, write_statement.cache_info().currsize
    core: list[str] = []

    def on_statement(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if context.compiled is not None:  # a Core construct: cache key generated for this call
            core.append(" ".join(statement.split())[:160])

    sync = app.state.services.engine.sync_engine
    event.listen(sync, "before_cursor_execute", on_statement)
    try:
        await _reserve(admin_client, pool)
    finally:
        event.remove(sync, "before_cursor_execute", on_statement)
    assert core == [], "\n".join(core)
    # the same shape compiles no new lock or write statement, and the insert stays compiled
    assert (lock_statement.cache_info().currsize, write_statement.cache_info().currsize) == compiled_before
    assert INSERT_RESERVATION._compiled is not None
