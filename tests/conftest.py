"""Shared fixtures: a real PostgreSQL database per test run, migrated with Alembic, and the real app.

``DATABASE_URL`` (CI, or the machine's PostgreSQL) names the server; without it an embedded PostgreSQL
(pgserver) is started in a temporary folder. Each run creates its own uniquely named database and drops
it at the end, so two runs never collide. Tests that commit get clean tables (TRUNCATE) before they run.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.database_url import parse as parse_url
from app.database_url import to_libpq
from app.db.engine import create_engine, migrate
from app.db.tables import metadata
from app.settings import Settings

ADMIN_KEY = "test-admin-key-" + "0" * 32
# tests hammer the service from one address with one key: rate limits are off unless a test sets them,
# and counted in each process's memory (no statement of the deployment's windows among those tests count)
UNLIMITED_RATES = {
    "BC_RATE_LIMIT": "1000000/second",
    "BC_AUTH_FAILURE_RATE_LIMIT": "1000000/second",
    "BC_RATE_LIMIT_STORAGE": "memory",
}
DATA = Path(__file__).parent / "data"


def _server_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    from app.db.engine import start_embedded_postgres

    folder = Path(tempfile.gettempdir()) / "bc-test-pgdata"
    return start_embedded_postgres(folder, database="postgres")


def _admin_exec(server_url: str, statement: str) -> None:
    """Run one statement on the server's ``postgres`` database (CREATE / DROP DATABASE)."""
    import asyncio

    import asyncpg

    dsn = to_libpq(parse_url(server_url).set(database="postgres"))

    async def run() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(run())


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A fresh, migrated database for this test run (dropped afterwards)."""
    server_url = _server_url()
    name = f"bc_test_{os.getpid()}_{secrets.token_hex(4)}"
    _admin_exec(server_url, f'CREATE DATABASE "{name}"')
    url = to_libpq(parse_url(server_url).set(database=name))
    try:
        migrate(url)
        yield url
    finally:
        _admin_exec(
            server_url,
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' "
            "AND pid <> pg_backend_pid()",
        )
        _admin_exec(server_url, f'DROP DATABASE IF EXISTS "{name}"')


@pytest.fixture(scope="session")
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    """An asyncpg engine on the test database."""
    eng = create_engine(database_url, pool_size=20)
    yield eng
    await eng.dispose()


TABLES = ", ".join(t.name for t in reversed(metadata.sorted_tables))


@pytest.fixture
async def clean_db(engine: AsyncEngine) -> AsyncEngine:
    """Empty every table before the test (tests that commit, such as races, need real commits)."""
    async with engine.begin() as conn:
        await conn.exec_driver_sql(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE")
    return engine


def settings_for(database_url: str, **overrides: Any) -> Settings:
    """Settings for a test app on ``database_url`` with the test admin key."""
    rates = {"rate_limit": UNLIMITED_RATES["BC_RATE_LIMIT"]}
    rates["auth_failure_rate_limit"] = UNLIMITED_RATES["BC_AUTH_FAILURE_RATE_LIMIT"]
    rates["rate_limit_storage"] = UNLIMITED_RATES["BC_RATE_LIMIT_STORAGE"]
    return Settings(database_url=database_url, bootstrap_admin_key=ADMIN_KEY, **{**rates, **overrides})


@pytest.fixture
async def app(database_url: str, clean_db: AsyncEngine) -> AsyncIterator[Any]:
    """The real FastAPI app on the test database, with its lifespan running (clean tables)."""
    from app.main import create_app

    application = create_app(settings_for(database_url), run_migrations=False)
    async with application.router.lifespan_context(application):
        yield application


def _client(application: Any, key: str | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=application), base_url="http://test", headers=headers, timeout=60
    )


@pytest.fixture
async def admin_client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client of the real app with the bootstrap admin key."""
    async with _client(app, ADMIN_KEY) as c:
        yield c


@pytest.fixture
async def anon_client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client of the real app without a key."""
    async with _client(app, None) as c:
        yield c


@pytest.fixture
def client_for(app: Any) -> Any:
    """``client_for(key)`` -> an httpx client of the real app with that key (close it yourself)."""
    return lambda key: _client(app, key)
