"""Count the round trips an engine makes to PostgreSQL (issue 15: a reserve takes at most 10).

Counted: every statement the driver sends (``before_cursor_execute``: plain statements, SAVEPOINT,
RELEASE, ROLLBACK TO), every transaction begin, commit and rollback on a connection that is not in
autocommit (the asyncpg adapter sends BEGIN before the first statement and COMMIT / ROLLBACK at the
end), and every pool checkout (``pool_pre_ping`` pings the connection with one round trip). The
statements themselves are kept, so a failing count names what crept in.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine


@dataclass
class RoundTrips:
    """What was sent, one entry per round trip, in order."""

    sent: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.sent)

    def __str__(self) -> str:
        return "\n".join(f"{i + 1:>3}. {s}" for i, s in enumerate(self.sent))


def _autocommit(conn: Connection) -> bool:
    return conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"


@contextmanager
def counting(engine: AsyncEngine) -> Iterator[RoundTrips]:
    """Count the round trips of ``engine`` inside the block."""
    trips = RoundTrips()
    sync = engine.sync_engine

    def on_statement(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        trips.sent.append(" ".join(statement.split())[:160])

    def on_begin(conn: Connection) -> None:
        if not _autocommit(conn):
            trips.sent.append("BEGIN")

    def on_commit(conn: Connection) -> None:
        if not _autocommit(conn):
            trips.sent.append("COMMIT")

    def on_rollback(conn: Connection) -> None:
        if not _autocommit(conn):
            trips.sent.append("ROLLBACK")

    def on_checkout(dbapi_conn, record, proxy):  # type: ignore[no-untyped-def]
        trips.sent.append("(pre-ping on checkout)")

    hooks = [
        (sync, "before_cursor_execute", on_statement),
        (sync, "begin", on_begin),
        (sync, "commit", on_commit),
        (sync, "rollback", on_rollback),
        (sync.pool, "checkout", on_checkout),
    ]
    for target, name, fn in hooks:
        event.listen(target, name, fn)
    try:
        yield trips
    finally:
        for target, name, fn in hooks:
            event.remove(target, name, fn)
