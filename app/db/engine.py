"""Engine creation, the embedded PostgreSQL default, and migrations on start.

``DATABASE_URL`` set -> that PostgreSQL. Unset -> an embedded PostgreSQL (pgserver) in
``<user data dir>/better-compute/pgdata`` (or ``BC_DATA_DIR``), with database ``better_compute``.
Either way :func:`migrate` runs Alembic to head before the service serves.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.database_url import hosts as listed_hosts
from app.database_url import parse as parse_url
from app.database_url import to_libpq
from app.db.audit import install as install_audit

EMBEDDED_DB_NAME = "better_compute"
PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
_embedded_servers: list[Any] = []  # keep pgserver handles alive for the process


def async_url(url: str) -> str:
    """``postgresql://...`` -> ``postgresql+asyncpg://...`` (other drivers are replaced too). libpq's list
    of hosts (``postgresql://h1:p1,h2:p2/db?target_session_attrs=read-write``) becomes SQLAlchemy's
    repeated ``host=`` parameters, ``target_session_attrs`` kept: asyncpg tries the hosts in order and
    connects to the first that matches, so a new connection finds the primary after a failover
    (:mod:`app.database_url`)."""
    return parse_url(url).set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


def default_data_dir() -> Path:
    """Where the embedded PostgreSQL keeps its data: the user's data directory."""
    import platformdirs

    return Path(platformdirs.user_data_dir("better-compute")) / "pgdata"


def start_embedded_postgres(data_dir: Path | None = None, database: str = EMBEDDED_DB_NAME) -> str:
    """Start (or reuse) the embedded PostgreSQL and return a ``postgresql://`` URL to ``database``.

    Creates the database on first use. Raises ``RuntimeError`` when pgserver cannot start.
    """
    import warnings

    path = Path(data_dir) if data_dir else default_data_dir()
    path.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # platformdirs: "XDG_RUNTIME_DIR is not set" on servers; harmless
        warnings.simplefilter("ignore")
        import pgserver

        server = pgserver.get_server(str(path), cleanup_mode="stop")
    _embedded_servers.append(server)
    exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{database}';")
    if "(1 row)" not in exists:
        server.psql(f"CREATE DATABASE {database};")
    base = make_url(server.get_uri())
    return base.set(database=database).render_as_string(hide_password=False)


def resolve_database_url(database_url: str | None, data_dir: Path | None = None) -> str:
    """``DATABASE_URL`` when set, else the embedded server's URL (started on demand)."""
    return database_url or start_embedded_postgres(data_dir)


def create_engine(url: str, pool_size: int = 10, max_overflow: int | None = None) -> AsyncEngine:
    """An asyncpg-backed SQLAlchemy engine for ``url`` (READ COMMITTED, the PostgreSQL default) that keeps
    ``pool_size`` connections open and opens up to ``max_overflow`` more (by default a quarter more, at
    least 2) under load, closing those when they are returned: a request that finds all of them in use
    waits for one.

    A pooled connection the server closed meanwhile (PostgreSQL restarted, the backend was terminated)
    is replaced when it is checked out (:func:`replace_closed_connection`), so the first request after a
    restart reconnects instead of failing. That check costs no round trip: SQLAlchemy's ``pool_pre_ping``
    sent BEGIN, a query and ROLLBACK on every checkout, three round trips that were the largest cost of a
    quiet heartbeat (bench/heartbeat.py)."""
    engine = create_async_engine(
        async_url(url),
        pool_size=pool_size,
        max_overflow=max(2, pool_size // 4) if max_overflow is None else max_overflow,
        connect_args={"server_settings": {"application_name": "better-compute"}},
    )
    event.listen(engine.sync_engine.pool, "checkout", replace_closed_connection)
    install_audit(engine)  # a request's audit row rides on the transaction it commits (app/db/audit.py)
    return engine


def replace_closed_connection(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """Pool ``checkout`` hook: raise :class:`~sqlalchemy.exc.DisconnectionError` for a connection whose
    socket the server has closed, so the pool discards it and connects anew (up to three times).

    asyncpg marks a connection closed as soon as its event loop reads the server's end of the socket; a
    server that shuts down (fast or smart) or terminates a backend closes it, so an idle pooled
    connection is known to be dead before the next request checks it out."""
    if dbapi_connection.driver_connection.is_closed():
        raise DisconnectionError("the server closed this pooled connection")


def alembic_config(url: str) -> Any:
    """The Alembic config for this project with ``sqlalchemy.url`` set to ``url``."""
    from alembic.config import Config

    cfg = Config(str(PROJECT_ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(PROJECT_ROOT / "alembic"))
    cfg.set_main_option("sqlalchemy.url", async_url(url).replace("%", "%%"))
    return cfg


def migrate(url: str) -> None:
    """Run Alembic migrations to head on ``url`` (blocking; call from a thread inside an event loop)."""
    from alembic import command

    command.upgrade(alembic_config(url), "head")


async def migrate_async(url: str) -> None:
    """:func:`migrate` off the event loop."""
    await asyncio.to_thread(migrate, url)


_NETWORK_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.EPIPE, errno.ETIMEDOUT, errno.EHOSTUNREACH}
_NETWORK_ERRNOS |= {errno.ENETUNREACH, errno.ECONNABORTED}


def is_outage(exc: BaseException) -> bool:
    """True when ``exc`` (or what it wraps) says the database cannot be reached or is going away:
    refused or dropped connections, a server starting up or shutting down, a pool checkout timeout.
    Such failures answer 503 UNAVAILABLE (nothing was committed); any other error stays a 500."""
    import asyncpg
    import sqlalchemy.exc as sa_exc

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, sa_exc.DBAPIError) and current.connection_invalidated:
            return True
        if isinstance(current, sa_exc.TimeoutError):  # QueuePool limit reached, nothing freed in time
            return True
        if isinstance(
            current,
            (
                ConnectionError,  # refused, reset, broken pipe
                TimeoutError,  # connect timeout
                socket.gaierror,  # the database host name does not resolve (DNS down)
                asyncpg.exceptions.PostgresConnectionError,
                asyncpg.exceptions.CannotConnectNowError,  # the database system is starting up
                asyncpg.exceptions.TooManyConnectionsError,  # 53300: no connection slot free (server or role)
                asyncpg.exceptions.OperatorInterventionError,  # admin shutdown, crash shutdown
                # of several hosts none is the primary (yet): a failover is promoting a standby
                asyncpg.exceptions.TargetServerAttributeNotMatched,
            ),
        ):
            return True
        if isinstance(current, OSError) and (
            current.errno in _NETWORK_ERRNOS or "Multiple exceptions" in str(current)
        ):
            return True  # asyncpg trying every address of the host: "Multiple exceptions: [Errno 111] ..."
        current = getattr(current, "orig", None) or current.__cause__ or current.__context__
    return False


async def ping(engine: AsyncEngine) -> None:
    """``SELECT 1`` on a connection of its own (readiness); raises what the driver raises when the
    database does not answer."""
    async with engine.connect() as conn:
        await conn.exec_driver_sql("SELECT 1")


def where(url: str) -> str:
    """``url`` without its user and password: ``postgresql://host:port/database`` (for messages;
    ``postgresql://h1:p1,h2:p2/database`` for several hosts)."""
    u = parse_url(url)
    if listed_hosts(u):
        return f"postgresql://{','.join(listed_hosts(u))}/{u.database or ''}"
    port = f":{u.port}" if u.port else ""
    socket_dir = u.query.get("host")  # postgresql://user@/db?host=/run/postgresql: a Unix socket
    host = u.host or (f"[{socket_dir}]" if isinstance(socket_dir, str) else "localhost")
    return f"postgresql://{host}{port}/{u.database or ''}"


def probe_database(url: str, timeout: float = 10.0) -> str | None:
    """Connect to ``url`` once (blocking, at most ``timeout`` seconds) and close again: None when the
    database answers, else why not in one line (``connection refused``, ``database "x" does not
    exist``, ``password authentication failed for user "u"``). Run before migrating, so a wrong or
    unreachable ``DATABASE_URL`` is one line on start instead of the migration's traceback."""
    import asyncpg

    async def attempt() -> None:
        conn = await asyncpg.connect(to_libpq(parse_url(url)), timeout=timeout)
        await conn.close()

    try:
        asyncio.run(attempt())
    except asyncpg.exceptions.TargetServerAttributeNotMatched:  # every host answered, none is the primary
        return "no host matches target_session_attrs (a failover in progress?)"
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError) as exc:
        if isinstance(exc, ConnectionRefusedError) or "Connect call failed" in str(exc):
            return "connection refused"
        if isinstance(exc, TimeoutError):
            return f"no answer within {timeout:g} s"
        return " ".join(str(exc).split()) or type(exc).__name__
    return None
