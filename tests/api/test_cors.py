"""CORS (issue 10, "Done when" 6): ``BC_CORS_ORIGINS`` lets a browser dashboard on an allowed origin
call the API, preflight included for ``Authorization`` and ``Content-Type``; any other origin gets no CORS
header at all; with no origins configured CORS is off."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.main import create_app
from app.settings import Settings
from tests.conftest import ADMIN_KEY, settings_for

DASHBOARD = "https://dash.example.com"
PREFLIGHT = {
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


async def _client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    application = create_app(settings, run_migrations=False)
    async with application.router.lifespan_context(application):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=application), base_url="http://test"
        ) as c:
            yield c


@pytest.fixture
async def client(database_url: str, clean_db: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    async for c in _client(settings_for(database_url, cors_origins=[DASHBOARD, "http://localhost:3000"])):
        yield c


@pytest.fixture
async def no_cors_client(database_url: str, clean_db: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    async for c in _client(settings_for(database_url)):
        yield c


def _cors_headers(r: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in r.headers.items() if k.lower().startswith("access-control-")}


async def test_a_preflight_from_an_allowed_origin_succeeds(client: httpx.AsyncClient) -> None:
    r = await client.options("/v1/reservations", headers={"Origin": DASHBOARD, **PREFLIGHT})
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == DASHBOARD
    allowed = {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type"} <= allowed
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "access-control-allow-credentials" not in r.headers  # keys travel in a header, not cookies
    assert r.headers["x-request-id"]  # the access-log middleware is outside CORS: it sees this answer


async def test_the_request_after_the_preflight_is_readable_by_the_page(client: httpx.AsyncClient) -> None:
    headers = {"Origin": DASHBOARD, "Authorization": f"Bearer {ADMIN_KEY}"}
    r = await client.post("/v1/pools", json={"name": "from-a-browser"}, headers=headers)
    assert r.status_code == 201
    assert r.headers["access-control-allow-origin"] == DASHBOARD
    exposed = {h.strip().lower() for h in r.headers["access-control-expose-headers"].split(",")}
    assert "x-request-id" in exposed


@pytest.mark.parametrize("origin", ["https://evil.example.com", "https://dash.example.com.evil.io", "null"])
async def test_another_origin_gets_no_cors_headers(client: httpx.AsyncClient, origin: str) -> None:
    preflight = await client.options("/v1/reservations", headers={"Origin": origin, **PREFLIGHT})
    assert _cors_headers(preflight) == {} and preflight.status_code == 401
    # not a preflight the API answers: an OPTIONS without a key, refused by the request guard
    simple = await client.get("/v1/pools", headers={"Origin": origin, "Authorization": f"Bearer {ADMIN_KEY}"})
    assert simple.status_code == 200 and _cors_headers(simple) == {}


async def test_no_origins_configured_means_no_cors(no_cors_client: Any) -> None:
    r = await no_cors_client.options("/v1/reservations", headers={"Origin": DASHBOARD, **PREFLIGHT})
    assert _cors_headers(r) == {} and r.status_code == 401  # the guard: no key


def test_the_setting_is_a_json_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BC_CORS_ORIGINS", '["https://a.example", "https://b.example"]')
    assert Settings().cors_origins == ["https://a.example", "https://b.example"]
    monkeypatch.delenv("BC_CORS_ORIGINS")
    assert Settings().cors_origins == []


@pytest.mark.parametrize(
    ("asked", "path", "named"),
    [
        (
            {"Access-Control-Request-Headers": "authorization, x-secret"},
            "Access-Control-Request-Headers",
            "x-secret",
        ),
        ({"Access-Control-Request-Method": "PATCH"}, "Access-Control-Request-Method", "PATCH"),
    ],
)
async def test_a_preflight_asking_too_much_is_422_in_the_error_shape(
    client: httpx.AsyncClient, asked: dict[str, str], path: str, named: str
) -> None:
    r = await client.options("/v1/reservations", headers={"Origin": DASHBOARD, **PREFLIGHT, **asked})
    assert r.status_code == 422 and r.headers["content-type"] == "application/json", r.text
    error = r.json()["error"]
    assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == path
    assert named in error["message"] and error["message"].startswith(f"{path}: ")
    assert r.headers["access-control-allow-origin"] == DASHBOARD  # the page can read why
    assert r.headers["x-request-id"]
