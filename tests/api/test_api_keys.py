"""API keys that can be listed and expire (docs/operating.md, "Keys"): ``GET /v1/api-keys`` for an admin
and for a tenant key, ``expiresAt`` on create (401 ``key expired`` afterwards, also from the guard's cache
of principals), revocation seen in the list, and ``lastUsedAt`` written at most once a minute per key.
Real PostgreSQL and the real app; expiry is reached by waiting a second or two, or by setting
``expires_at`` in the past in the database (no clock is mocked)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.tables import api_keys
from app.iam.authorize import Principal
from app.iam.key_cache import PrincipalCache
from tests.conftest import ADMIN_KEY, running_app

A, B = "tenant-a", "tenant-b"
READ_A = {"action": "compute:reservations:read", "resource": f"tenant:{A}"}
ADMIN_OF_A = {"action": "compute:iam:admin", "resource": f"tenant:{A}"}


def _client(application: Any, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=application),
        base_url="http://test",
        headers={"Authorization": f"Bearer {key}"},
    )


async def _create(admin: httpx.AsyncClient, tenant: str | None, *grants: dict[str, str], **extra: Any) -> Any:
    body = {"principal": f"p-{tenant}", "tenantId": tenant, "grants": list(grants), **extra}
    r = await admin.post("/v1/api-keys", json=body)
    assert r.status_code == 201, r.text
    return r.json()


async def _listed(client: httpx.AsyncClient, limit: int = 1000) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": limit}
    while True:
        r = await client.get("/v1/api-keys", params=params)
        assert r.status_code == 200, r.text
        items += r.json()["items"]
        if not r.json()["nextCursor"]:
            return items
        params = {"limit": limit, "cursor": r.json()["nextCursor"]}


async def _db_now(engine: AsyncEngine) -> datetime:
    async with engine.connect() as conn:
        return (await conn.execute(sa.select(sa.func.now()))).scalar_one()


async def _key_count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return (await conn.execute(sa.select(sa.func.count()).select_from(api_keys))).scalar_one()


def _refusal(r: httpx.Response) -> tuple[int, str, str]:
    return r.status_code, r.json()["error"]["code"], r.json()["error"]["message"]


async def test_an_admin_lists_every_key_and_a_tenant_key_its_tenants_only(
    admin_client: httpx.AsyncClient, client_for: Any
) -> None:
    a_admin = await _create(admin_client, A, READ_A, ADMIN_OF_A)
    a_reader = await _create(admin_client, A, READ_A)
    b_admin = await _create(admin_client, B, {"action": "compute:iam:admin", "resource": f"tenant:{B}"})
    untenanted = await _create(admin_client, None)
    everything = await _listed(admin_client)
    assert [k["id"] for k in everything] == [untenanted["id"], b_admin["id"], a_reader["id"], a_admin["id"]]
    assert [k["id"] for k in await _listed(admin_client, limit=1)] == [k["id"] for k in everything]
    first = everything[-1]
    assert set(first) == {
        "id",
        "principal",
        "tenantId",
        "grants",
        "createdAt",
        "expiresAt",
        "revokedAt",
        "lastUsedAt",
    }
    assert first["principal"] == f"p-{A}" and first["tenantId"] == A
    assert first["grants"] == sorted([READ_A, ADMIN_OF_A], key=lambda g: (g["action"], g["resource"]))
    assert all(a_admin["key"] not in str(k) for k in everything)  # never the secret
    async with client_for(a_admin["key"]) as tenant_a, client_for(a_reader["key"]) as reader:
        assert [k["id"] for k in await _listed(tenant_a)] == [a_reader["id"], a_admin["id"]]
        r = await reader.get("/v1/api-keys")  # its tenant's key without compute:iam:admin
        assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN"
    async with client_for(untenanted["key"]) as no_grant:
        assert (await no_grant.get("/v1/api-keys")).status_code == 403
    cursor = (await admin_client.get("/v1/api-keys", params={"cursor": "bm90LWEtY3Vyc29y"})).json()
    assert cursor["error"]["code"] == "INVALID_INPUT" and cursor["error"]["details"]["path"] == "cursor"


async def test_an_untenanted_key_admin_of_some_tenants_lists_their_keys(
    admin_client: httpx.AsyncClient, client_for: Any
) -> None:
    ops = await _create(admin_client, None, ADMIN_OF_A)
    of_a = await _create(admin_client, A)
    await _create(admin_client, B)
    async with client_for(ops["key"]) as client:
        assert [k["id"] for k in await _listed(client)] == [of_a["id"]]


async def test_a_key_with_expires_at_works_until_then_and_is_401_key_expired_even_when_cached(
    database_url: str, clean_db: AsyncEngine
) -> None:
    # a 60 s cache of principals: a cache that ignored expiry would keep serving the key
    async with running_app(database_url, key_cache_seconds=60) as application:
        async with _client(application, ADMIN_KEY) as admin:
            expires = await _db_now(clean_db) + timedelta(seconds=4)  # room for a loaded machine
            made = await _create(admin, A, READ_A, expiresAt=expires.isoformat())
            assert datetime.fromisoformat(made["expiresAt"]) == expires
            listed = {k["id"]: k for k in await _listed(admin)}
            assert datetime.fromisoformat(listed[made["id"]]["expiresAt"]) == expires
        async with _client(application, made["key"]) as user:
            r = await user.get("/v1/reservations")
            assert r.status_code == 200, r.text  # before the expiry (and now cached)
            for _ in range(100):  # a bounded wait until the database's clock passes the expiry
                if await _db_now(clean_db) > expires:
                    break
                await asyncio.sleep(0.1)
            r = await user.get("/v1/reservations")
            assert _refusal(r) == (401, "UNAUTHENTICATED", "key expired")


async def test_a_key_whose_expiry_passed_is_refused(
    admin_client: httpx.AsyncClient, client_for: Any, clean_db: AsyncEngine
) -> None:
    made = await _create(admin_client, A, READ_A, expiresAt="2999-01-01T00:00:00+02:00")
    async with clean_db.begin() as conn:
        await conn.execute(
            sa.update(api_keys)
            .where(api_keys.c.id == made["id"])
            .values(expires_at=sa.func.now() - sa.text("interval '1 second'"))
        )
    async with client_for(made["key"]) as user:
        r = await user.get("/v1/reservations")
        assert _refusal(r) == (401, "UNAUTHENTICATED", "key expired")


@pytest.mark.parametrize(
    ("expires_at", "why"),
    [
        ("2001-01-01T00:00:00Z", "in the future"),
        ("tomorrow", "datetime"),
        ("2030-01-01T00:00:00", "timezone"),
        (1893456000, "ISO 8601"),
        ("9999-12-31T23:00:00-05:00", "before year 10000"),
    ],
)
async def test_a_bad_expires_at_is_422_at_expires_at_and_creates_nothing(
    admin_client: httpx.AsyncClient, clean_db: AsyncEngine, expires_at: Any, why: str
) -> None:
    before = await _key_count(clean_db)
    r = await admin_client.post(
        "/v1/api-keys", json={"principal": "x", "tenantId": A, "grants": [READ_A], "expiresAt": expires_at}
    )
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == "expiresAt", error
    assert why in error["message"], error
    assert await _key_count(clean_db) == before


async def test_a_revoked_key_is_401_and_listed_with_revoked_at(
    admin_client: httpx.AsyncClient, client_for: Any
) -> None:
    made = await _create(admin_client, A, READ_A)
    async with client_for(made["key"]) as user:
        assert (await user.get("/v1/reservations")).status_code == 200
        assert (await admin_client.delete(f"/v1/api-keys/{made['id']}")).status_code == 204
        r = await user.get("/v1/reservations")
        assert _refusal(r) == (401, "UNAUTHENTICATED", "unknown or revoked API key")
    listed = {k["id"]: k for k in await _listed(admin_client)}
    assert listed[made["id"]]["revokedAt"] is not None
    assert (await admin_client.delete(f"/v1/api-keys/{made['id']}")).status_code == 404


TOUCHES = "bc_test_key_touches"


@asynccontextmanager
async def _counting_last_use_writes(engine: AsyncEngine) -> AsyncIterator[Any]:
    """A trigger that counts the row writes of ``api_keys.last_used_at`` (dropped afterwards);
    yields ``count()``, the writes so far."""
    async with engine.begin() as conn:
        for statement in (
            f"CREATE TABLE {TOUCHES} (key_id text NOT NULL)",
            f"CREATE FUNCTION {TOUCHES}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"INSERT INTO {TOUCHES} VALUES (NEW.id); RETURN NEW; END $$",
            f"CREATE TRIGGER {TOUCHES} AFTER UPDATE OF last_used_at ON api_keys "
            f"FOR EACH ROW EXECUTE FUNCTION {TOUCHES}()",
        ):
            await conn.exec_driver_sql(statement)

    async def count() -> int:
        async with engine.connect() as conn:
            return (await conn.exec_driver_sql(f"SELECT count(*) FROM {TOUCHES}")).scalar_one()

    try:
        yield count
    finally:
        async with engine.begin() as conn:
            await conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {TOUCHES} ON api_keys")
            await conn.exec_driver_sql(f"DROP FUNCTION IF EXISTS {TOUCHES}()")
            await conn.exec_driver_sql(f"DROP TABLE IF EXISTS {TOUCHES}")


async def test_last_used_at_is_set_on_use_and_written_at_most_once_a_minute(
    database_url: str, clean_db: AsyncEngine
) -> None:
    # no cache of principals: each of the 100 requests looks its key up, and still writes once
    async with running_app(database_url, key_cache_seconds=0) as application:
        async with _client(application, ADMIN_KEY) as admin:
            made = await _create(admin, A, READ_A)
            assert {k["id"]: k for k in await _listed(admin)}[made["id"]]["lastUsedAt"] is None
            async with (
                _counting_last_use_writes(clean_db) as writes,
                _client(application, made["key"]) as user,
            ):
                answers = [(await user.get("/v1/reservations")).status_code for _ in range(100)]
                assert answers == [200] * 100
                assert await writes() == 1
                used = {k["id"]: k for k in await _listed(admin)}[made["id"]]["lastUsedAt"]
                assert used is not None and datetime.fromisoformat(used) <= await _db_now(clean_db)
                async with clean_db.begin() as conn:  # a minute later, as far as the row says
                    await conn.execute(
                        sa.update(api_keys)
                        .where(api_keys.c.id == made["id"])
                        .values(last_used_at=sa.func.now() - sa.text("interval '61 seconds'"))
                    )
                assert await writes() == 2  # the update above
                for _ in range(10):
                    assert (await user.get("/v1/reservations")).status_code == 200
                assert await writes() == 3
                again = {k["id"]: k for k in await _listed(admin)}[made["id"]]["lastUsedAt"]
                assert datetime.fromisoformat(again) >= datetime.fromisoformat(used)


def test_the_principal_cache_keeps_a_key_no_longer_than_its_expiry() -> None:
    now = [100.0]
    cache = PrincipalCache(ttl=60.0, clock=lambda: now[0])
    short = Principal(id="p1", name="short", key_id="k1")
    cache.put("h1", short, expires_in=1.5)
    cache.put("h2", Principal(id="p2", name="forever", key_id="k2"))
    now[0] += 1.4
    assert cache.get("h1") is short
    now[0] += 0.1  # its expiry: looked up again (and refused by the database's clock)
    assert cache.get("h1") is None and cache.get("h2") is not None
