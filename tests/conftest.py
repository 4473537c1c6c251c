"""Shared fixtures: a real PostgreSQL database per test run, migrated with Alembic, and the real app.

``DATABASE_URL`` (CI, or the machine's PostgreSQL) names the server; without it an embedded PostgreSQL
(pgserver) is started in a temporary folder. Each run, and each pytest-xdist worker of a run, creates its
own uniquely named database and drops it at the end, so two runs or two workers never collide. Tests that
commit get clean tables (TRUNCATE) before they run.

``pytest`` runs on all cores (``-n auto --dist loadfile`` in pyproject.toml; a module's tests stay on one
worker, so a module-scoped service sees only its own module). The workers share the server's
``max_connections``, so every connection pool a test opens is bounded (:data:`POOL_SIZE`,
:data:`CONNECTIONS_PER_WORKER`) and ``-n auto`` starts no more workers than the server has connections for.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.database_url import parse as parse_url
from app.database_url import to_libpq
from app.db.engine import create_engine, migrate
from app.db.tables import metadata
from app.settings import Settings

if TYPE_CHECKING:
    from tests.servers import Server

ADMIN_KEY = "test-admin-key-" + "0" * 32
# tests hammer the service from one address with one key: rate limits are off unless a test sets them,
# and counted in each process's memory (no statement of the deployment's windows among those tests count)
UNLIMITED_RATES = {
    "BC_RATE_LIMIT": "1000000/second",
    "BC_AUTH_FAILURE_RATE_LIMIT": "1000000/second",
    "BC_RATE_LIMIT_STORAGE": "memory",
}
DATA = Path(__file__).parent / "data"
# the connection pool of a test's app or service process: 12 kept, 3 more under load, 3 of them held by
# the LISTEN controllers (the service's default of 24 would let two workers' two-process races exhaust a
# server's 100 connections)
POOL_SIZE = 12
# the most one worker holds at once, with room to spare: two service processes (2 x 15) and the test's
# own engine, which keeps 5 between tests. Measured (a worker's database in pg_stat_activity, sampled every
# 0.2 s): 35 at most (test_lifecycle_replicas), two workers 51 together; 47 for that test with the
# service's default pool, before these bounds
CONNECTIONS_PER_WORKER = 45


def _server_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    from app.db.engine import start_embedded_postgres

    folder = Path(tempfile.gettempdir()) / "bc-test-pgdata"
    return start_embedded_postgres(folder, database="postgres")


def _max_connections() -> int:
    """The ``max_connections`` of the server ``DATABASE_URL`` names (100, PostgreSQL's default, when it
    is unset, as for the embedded server, or does not answer)."""
    import asyncio

    import asyncpg

    url = os.environ.get("DATABASE_URL")
    if not url:
        return 100

    async def ask() -> int:
        conn = await asyncpg.connect(to_libpq(parse_url(url)), timeout=10)
        try:
            return int(await conn.fetchval("SHOW max_connections"))
        finally:
            await conn.close()

    try:
        return asyncio.run(ask())
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError):
        return 100


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one worker per core, but no more than the server's ``max_connections`` leave room for
    (:data:`CONNECTIONS_PER_WORKER` each, 10 kept for others), and none (the run stays in this process)
    when the command names test files of one module only. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still wins."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    named = {str(arg).split("::", 1)[0] for arg in config.args}
    if len(named) == 1 and Path(next(iter(named))).is_file():
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, (_max_connections() - 10) // CONNECTIONS_PER_WORKER))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules marked ``slow`` (``pytestmark``) first, the others in their order: each worker takes the
    next module when it finishes one (``--dist loadfile``), so the longest start early and the run does
    not end with one worker on a long module while the others wait."""
    items.sort(key=lambda item: item.getparent(pytest.Module).get_closest_marker("slow") is None)


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
    eng = create_engine(database_url, pool_size=5, max_overflow=20)  # 25 at once, 5 kept between tests
    yield eng
    await eng.dispose()


TABLES = ", ".join(t.name for t in reversed(metadata.sorted_tables))


async def truncate_all(engine: AsyncEngine) -> None:
    """Empty every table of the test database."""
    async with engine.begin() as conn:
        await conn.exec_driver_sql(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE")


@pytest.fixture
async def clean_db(engine: AsyncEngine) -> AsyncEngine:
    """Empty every table before the test (tests that commit, such as races, need real commits)."""
    await truncate_all(engine)
    return engine


@pytest.fixture(scope="module")
async def fresh_tables(engine: AsyncEngine) -> None:
    """Empty every table once for the module (its tests share one service and make their own data)."""
    await truncate_all(engine)


@pytest.fixture(scope="module")
def server(
    database_url: str,
    fresh_tables: None,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Server]:
    """One real ``better-compute serve`` process per module on the test database, on fresh tables
    (tests/servers.py). A module that needs other settings defines its own ``server``."""
    from tests.servers import running_server  # tests/servers.py imports this module

    logs = tmp_path_factory.mktemp(f"server-{request.module.__name__.rsplit('.', 1)[-1]}")
    with running_server(database_url, logs) as started:
        yield started


def settings_for(database_url: str, **overrides: Any) -> Settings:
    """Settings for a test app on ``database_url`` with the test admin key."""
    defaults: dict[str, Any] = {"rate_limit": UNLIMITED_RATES["BC_RATE_LIMIT"], "db_pool_size": POOL_SIZE}
    defaults["auth_failure_rate_limit"] = UNLIMITED_RATES["BC_AUTH_FAILURE_RATE_LIMIT"]
    defaults["rate_limit_storage"] = UNLIMITED_RATES["BC_RATE_LIMIT_STORAGE"]
    return Settings(database_url=database_url, bootstrap_admin_key=ADMIN_KEY, **{**defaults, **overrides})


@asynccontextmanager
async def running_app(database_url: str, **settings: Any) -> AsyncIterator[Any]:
    """The real FastAPI app on ``database_url`` with :func:`settings_for` and ``settings``, its lifespan
    running while the block runs."""
    from app.main import create_app

    application = create_app(settings_for(database_url, **settings), run_migrations=False)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def app(database_url: str, clean_db: AsyncEngine) -> AsyncIterator[Any]:
    """The real FastAPI app on the test database, with its lifespan running (clean tables)."""
    async with running_app(database_url) as application:
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
