"""Rate limits (issue 9): per key ``BC_RATE_LIMIT``, per client address for failed authentication
``BC_AUTH_FAILURE_RATE_LIMIT``; over either, 429 ``RATE_LIMITED`` with ``Retry-After``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.guard import RECENT_KEY_SECONDS, RecentKeys
from tests.conftest import ADMIN_KEY, settings_for


@asynccontextmanager
async def _app(database_url: str, per_key: str, storage: str) -> AsyncIterator[Any]:
    """The real app with ``per_key`` requests per key and 3 failed authentications a minute per address,
    counted in ``storage`` (``BC_RATE_LIMIT_STORAGE``)."""
    from app.main import create_app

    settings = settings_for(
        database_url, rate_limit=per_key, auth_failure_rate_limit="3/minute", rate_limit_storage=storage
    )
    application = create_app(settings, run_migrations=False)
    async with application.router.lifespan_context(application):
        yield application


# the deployment's windows (the default) and each process's own count: the same answers in one process
STORAGES = pytest.mark.parametrize("storage", ["postgresql", "memory"], indirect=True)


@pytest.fixture
def storage(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def limited_app(database_url: str, clean_db: AsyncEngine, storage: str) -> AsyncIterator[Any]:
    async with _app(database_url, "5/minute", storage) as application:
        yield application


def _client(application: Any, key: str | None, address: str = "10.0.0.1") -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    transport = httpx.ASGITransport(app=application, client=(address, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers)


def _assert_limited(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    assert response.json()["error"]["code"] == "RATE_LIMITED"
    assert 1 <= int(response.headers["Retry-After"]) <= 60


@STORAGES
async def test_a_key_over_its_rate_is_429_and_other_keys_are_not(limited_app: Any) -> None:
    async with _client(limited_app, ADMIN_KEY) as admin:
        statuses = [(await admin.get("/v1/pools")).status_code for _ in range(5)]
        assert statuses == [200] * 5
        _assert_limited(await admin.get("/v1/pools"))
        # health and metrics are not rate limited
        assert (await admin.get("/healthz")).status_code == 200
    async with _client(limited_app, ADMIN_KEY, "10.0.0.2") as elsewhere:  # per key, not per address
        _assert_limited(await elsewhere.get("/v1/pools"))


@STORAGES
async def test_failed_authentication_is_limited_per_address(limited_app: Any) -> None:
    async with _client(limited_app, "bck_guessed") as guesser:
        statuses = [(await guesser.get("/v1/pools")).status_code for _ in range(3)]
        assert statuses == [401] * 3
        _assert_limited(await guesser.get("/v1/pools"))
    async with _client(limited_app, None) as keyless:  # the same address without a key
        _assert_limited(await keyless.post("/v1/pools", json={"name": "x"}))
    async with _client(limited_app, "bck_guessed", "10.0.0.9") as other:  # another address still 401
        assert (await other.get("/v1/pools")).status_code == 401
    async with _client(limited_app, ADMIN_KEY, "10.0.0.8") as admin:
        assert (await admin.get("/v1/pools")).status_code == 200
        metrics = (await admin.get("/metrics")).text
    assert 'bc_guard_refusals_total{code="RATE_LIMITED"}' in metrics
    assert 'bc_guard_refusals_total{code="UNAUTHENTICATED"}' in metrics


@pytest.fixture
async def guessed_app(database_url: str, clean_db: AsyncEngine, storage: str) -> AsyncIterator[Any]:
    """Failed authentications limited to 3 a minute per address; keys themselves barely limited."""
    async with _app(database_url, "1000/minute", storage) as application:
        yield application


@STORAGES
async def test_an_address_over_its_failure_limit_still_serves_keys_that_authenticated(
    guessed_app: Any,
) -> None:
    nat = "10.0.0.50"  # a guesser and two honest users behind one address
    grants = [{"action": "compute:reservations:read", "resource": "tenant:acme"}]
    async with _client(guessed_app, ADMIN_KEY, "10.0.0.60") as admin:
        minted = [
            (
                await admin.post(
                    "/v1/api-keys", json={"principal": f"u{i}", "tenantId": "acme", "grants": grants}
                )
            ).json()
            for i in range(3)
        ]
    honest, revoked, unseen_key = (m["key"] for m in minted)
    for key in (honest, revoked):
        async with _client(guessed_app, key, nat) as user:  # authenticates before the guessing starts
            assert (await user.get("/v1/reservations")).status_code == 200
    async with _client(guessed_app, "bck_guessed", nat) as guesser:
        assert [(await guesser.get("/v1/pools")).status_code for _ in range(3)] == [401] * 3
        _assert_limited(await guesser.get("/v1/pools"))
    async with _client(guessed_app, "bck_another_guess", nat) as guesser:  # unknown: refused unlooked-up
        _assert_limited(await guesser.get("/v1/pools"))
    async with _client(guessed_app, unseen_key, nat) as unseen:  # valid, but not seen in this process yet
        _assert_limited(await unseen.get("/v1/reservations"))
    async with _client(guessed_app, honest, nat) as user:
        assert [(await user.get("/v1/reservations")).status_code for _ in range(3)] == [200] * 3
    async with _client(guessed_app, ADMIN_KEY, "10.0.0.60") as admin:
        assert (await admin.delete(f"/v1/api-keys/{minted[1]['id']}")).status_code == 204
    async with _client(guessed_app, revoked, nat) as user:  # still looked up: revocation holds at once
        _assert_limited(await user.get("/v1/reservations"))
    async with _client(guessed_app, revoked, "10.0.0.70") as user:
        assert (await user.get("/v1/reservations")).status_code == 401


def test_recent_keys_are_bounded_and_expire() -> None:
    now = [1000.0]
    recent = RecentKeys(size=2, ttl=RECENT_KEY_SECONDS, clock=lambda: now[0])
    recent.remember("a")
    now[0] += RECENT_KEY_SECONDS - 1
    recent.remember("b")
    assert "a" in recent and "b" in recent
    now[0] += 2  # a's time is up, b's is not
    assert "a" not in recent and "b" in recent
    recent.remember("c")
    recent.remember("d")  # over the size: the oldest goes first
    assert "b" not in recent and {"c", "d"} == {k for k in "abcd" if k in recent}
    recent.forget("c")
    assert "c" not in recent
