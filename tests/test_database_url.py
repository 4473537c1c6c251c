"""A ``DATABASE_URL`` naming several hosts (docs/scaling.md, "High availability with Patroni"): libpq's
``postgresql://h1:p1,h2:p2/db?target_session_attrs=read-write`` reaches asyncpg through SQLAlchemy with
every host and ``target_session_attrs`` kept; a connection skips a host that refuses, and "no host is
the primary" (a failover promoting a standby) is an outage, answered 503 like a refused connection."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect
from sqlalchemy.engine import make_url

from app.database_url import parse, to_libpq
from app.db.engine import async_url, create_engine, is_outage, probe_database, where
from app.settings import SettingsError, load_settings
from tests.servers import free_port

HA = "postgresql://bc:s%40cret@db1:5432,db2:5433/compute?target_session_attrs=read-write"


@pytest.mark.parametrize(
    ("url", "hosts"),
    [
        (HA, ("db1:5432", "db2:5433")),
        ("postgresql://db1,db2:6000/compute", ("db1:5432", "db2:6000")),  # no port: the default
        ("postgresql+asyncpg://bc@/compute?host=db1:5432&host=db2:5433", ("db1:5432", "db2:5433")),
    ],
)
def test_several_hosts_become_host_parameters(url: str, hosts: tuple[str, ...]) -> None:
    assert parse(url).query["host"] == hosts
    assert parse(url).database == "compute"


def test_the_asyncpg_url_keeps_every_host_and_target_session_attrs() -> None:
    """What the installed SQLAlchemy hands to ``asyncpg.connect``: lists of hosts and ports, the
    session attribute and the password."""
    url = make_url(async_url(HA))
    assert url.drivername == "postgresql+asyncpg" and url.password == "s@cret"
    _, kwargs = asyncpg_dialect().create_connect_args(url)
    assert kwargs["host"] == ["db1", "db2"] and kwargs["port"] == [5432, 5433]
    assert kwargs["target_session_attrs"] == "read-write" and kwargs["database"] == "compute"


@pytest.mark.parametrize(
    "url",
    [
        HA,
        "postgresql://bc@db1:5432,db2:5433",
        "postgresql://postgres@127.0.0.1:5432/postgres",
        "postgresql://bc@/compute?host=/run/postgresql",
    ],
)
def test_libpq_form_round_trips(url: str) -> None:
    assert parse(to_libpq(parse(url))) == parse(url)


def test_libpq_form_of_several_hosts() -> None:
    assert to_libpq(parse(HA)) == HA


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://db1:x,db2/compute",
        "postgresql://db1:70000,db2/compute",
        "postgresql://,db2/compute",
        "postgresql://db1,db2/compute?host=db3",
        "postgresql://[::1]:5432,db2/compute",
    ],
)
def test_a_bad_list_of_hosts_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        parse(url)


def test_settings_take_several_hosts_and_check_each_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", HA)
    assert load_settings().database_url == HA
    monkeypatch.setenv("DATABASE_URL", "postgresql://bc:s3cret@db1:5432,db2:notaport/compute")
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert refused.value.setting == "DATABASE_URL" and "s3cret" not in str(refused.value)


def test_where_names_every_host_without_the_password() -> None:
    assert where(HA) == "postgresql://db1:5432,db2:5433/compute"


def _several_hosts(database_url: str, first: str | None, **query: str) -> str:
    """``database_url`` naming two hosts: ``first`` (None: its own), then its own."""
    url = parse(database_url)
    if url.host is None:
        pytest.skip("the test database listens on a Unix socket only (the embedded PostgreSQL)")
    own = f"{url.host}:{url.port or 5432}"
    listed = url.set(host=None, port=None).update_query_pairs(
        [("host", first or own), ("host", own), *query.items()], append=True
    )
    return to_libpq(listed)


async def test_a_connection_skips_a_host_that_refuses(database_url: str) -> None:
    refusing = f"127.0.0.1:{free_port()}"
    url = _several_hosts(database_url, refusing, target_session_attrs="read-write")
    assert "," in url and await asyncio.to_thread(probe_database, url) is None
    engine = create_engine(url, pool_size=1)
    try:
        async with engine.connect() as conn:
            assert (await conn.exec_driver_sql("SELECT pg_is_in_recovery()")).scalar_one() is False
    finally:
        await engine.dispose()


async def test_no_primary_among_the_hosts_is_an_outage(database_url: str) -> None:
    """Every host answers but none is what ``target_session_attrs`` asks for (while a failover promotes
    a standby, none is read-write): the error SQLAlchemy raises is an outage (503), not a 500."""
    url = _several_hosts(database_url, None, target_session_attrs="standby")  # its own host twice
    engine = create_engine(url, pool_size=1)
    try:
        with pytest.raises(Exception) as failed:
            async with engine.connect():
                pass
        assert is_outage(failed.value), repr(failed.value)
    finally:
        await engine.dispose()
    assert (
        await asyncio.to_thread(probe_database, url)
        == "no host matches target_session_attrs (a failover in progress?)"
    )
