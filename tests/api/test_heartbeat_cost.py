"""What keeps a quiet heartbeat cheap (issue 14, done-when 5) without changing what any request sees:
the guard's cache of key principals, the agent keys' own rate limit, the lean heartbeat handler and the
pooled connection check that replaced SQLAlchemy's three-round-trip pre-ping."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import create_engine
from app.db.tables import api_keys
from app.iam.authorize import Grant, Principal
from app.iam.key_cache import PrincipalCache
from tests.agent_host import FIRST_UUID, SECOND_UUID
from tests.api.test_agents import agent_key, hello_body
from tests.conftest import ADMIN_KEY, running_app
from tests.factories import make_pool

READ = {"action": "compute:reservations:read", "resource": "tenant:acme"}


def _client(application: Any, key: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=application, client=("10.0.0.1", 40000))
    return httpx.AsyncClient(
        transport=transport, base_url="http://test", headers={"Authorization": f"Bearer {key}"}
    )


def test_principal_cache_keeps_a_principal_for_its_ttl_and_forgets_a_revoked_key() -> None:
    now = [100.0]
    cache = PrincipalCache(ttl=2.0, clock=lambda: now[0])
    agent = Principal(id="p1", name="hosts", grants=(Grant("compute:nodes:hello", "pool:a"),), key_id="k1")
    other = Principal(id="p2", name="ops", key_id="k2")
    cache.put("h1", agent)
    cache.put("h2", other)
    now[0] += 1.9
    assert cache.get("h1") is agent and cache.get("h2") is other
    cache.forget_key("k1")  # revoked through this process
    assert cache.get("h1") is None and cache.get("h2") is other
    now[0] += 0.2  # h2's time is up
    assert cache.get("h2") is None
    off = PrincipalCache(ttl=0)
    off.put("h1", agent)
    assert off.get("h1") is None


async def _minted(admin: httpx.AsyncClient, pool: str) -> tuple[str, str]:
    r = await admin.post(
        "/v1/api-keys",
        json={"principal": "ops", "tenantId": "acme", "grants": [READ]},
    )
    assert r.status_code == 201, r.text
    return r.json()["id"], r.json()["key"]


async def _revoke_elsewhere(engine: AsyncEngine, key_id: str) -> None:
    """Revoke ``key_id`` the way another process does: in the database, not through this app."""
    async with engine.begin() as conn:
        await conn.execute(
            sa.update(api_keys).where(api_keys.c.id == key_id).values(revoked_at=sa.func.now())
        )


async def test_a_key_revoked_by_another_process_holds_until_the_cache_expires_and_at_once_here(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url, key_cache_seconds=60) as application:
        async with _client(application, ADMIN_KEY) as admin:
            pool = await make_pool(admin)
            elsewhere_id, elsewhere = await _minted(admin, pool)
            here_id, here = await _minted(admin, pool)
            for key in (elsewhere, here):
                async with _client(application, key) as user:
                    r = await user.get("/v1/reservations")
                    assert r.status_code == 200, r.text
            await _revoke_elsewhere(clean_db, elsewhere_id)
            async with _client(application, elsewhere) as user:  # cached: BC_KEY_CACHE_SECONDS bounds it
                assert (await user.get("/v1/reservations")).status_code == 200
            assert (await admin.delete(f"/v1/api-keys/{here_id}")).status_code == 204
            async with _client(application, here) as user:  # revoked through this process: at once
                assert (await user.get("/v1/reservations")).status_code == 401
    async with running_app(database_url, key_cache_seconds=0) as application:  # no cache: every request looks
        async with _client(application, ADMIN_KEY) as admin:
            key_id, key = await _minted(admin, pool)
        async with _client(application, key) as user:
            assert (await user.get("/v1/reservations")).status_code == 200
            await _revoke_elsewhere(clean_db, key_id)
            assert (await user.get("/v1/reservations")).status_code == 401


async def test_an_agent_key_has_its_own_rate_limit(database_url: str, clean_db: AsyncEngine) -> None:
    async with running_app(database_url, rate_limit="3/minute", agent_rate_limit="100/minute") as application:
        async with _client(application, ADMIN_KEY) as admin:
            pool = await make_pool(admin)
            key = await agent_key(admin, pool)
            # the third request of the admin key (a pool, a key, this one) is its last under 3/minute
            assert [(await admin.get("/v1/pools")).status_code for _ in range(2)] == [200, 429]
        async with _client(application, key) as agent:  # a pool's agents share one key
            beats = [
                (await agent.post("/v1/nodes/node_missing/heartbeat", json={})).status_code for _ in range(10)
            ]
            assert beats == [404] * 10


async def test_the_lean_heartbeat_answers_like_the_standard_handler(admin_client: httpx.AsyncClient) -> None:
    pool = await make_pool(admin_client)
    node = (await admin_client.post("/v1/nodes/hello", json=hello_body(pool))).json()["nodeId"]
    url = f"/v1/nodes/{node}/heartbeat"
    body = {"devices": [{"id": FIRST_UUID, "healthy": True}, {"id": SECOND_UUID, "healthy": True}]}
    lean = await admin_client.post(url, json=body)  # application/json: the lean handler
    # another media type spelling takes FastAPI's standard handler
    standard = await admin_client.post(
        url,
        content=httpx.Request("POST", url, json=body).content,
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert lean.status_code == standard.status_code == 200
    assert lean.content == standard.content
    assert lean.json() == {"nodeId": node, "changed": False, "noScheduleReasons": []}
    assert lean.headers["content-type"] == standard.headers["content-type"] == "application/json"
    # what the lean handler does not take, the standard one refuses as before
    twice = b'{"devices": [], "devices": []}'
    r = await admin_client.post(url, content=twice, headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["details"]["path"] == "devices"
    extra = await admin_client.post(url, json={**body, "surprise": 1})
    assert extra.status_code == 422 and extra.json()["error"]["details"]["path"] == "surprise"


async def test_a_pooled_connection_the_server_closed_is_replaced_at_checkout(database_url: str) -> None:
    engine, admin = create_engine(database_url, pool_size=1), create_engine(database_url, pool_size=1)
    alive = sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid")
    try:
        async with engine.connect() as conn:  # back in the pool afterwards, idle
            pid = (await conn.execute(sa.text("SELECT pg_backend_pid()"))).scalar_one()
        async with admin.connect() as other:  # as a PostgreSQL restart does to every backend
            await other.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            for _ in range(200):  # until the backend is gone (a bounded wait, not a timing assertion)
                if not (await other.execute(alive, {"pid": pid})).scalar_one():
                    break
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)  # the event loop reads the closed socket
        async with engine.connect() as conn:  # not an error: a new connection
            assert (await conn.execute(sa.text("SELECT pg_backend_pid()"))).scalar_one() != pid
    finally:
        await engine.dispose()
        await admin.dispose()
