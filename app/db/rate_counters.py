"""The deployment's rate-limit windows in PostgreSQL: one statement hands a process hits of a name's
current window (docs/operating.md, "Rate limits").

A name (``key:<key id>``, ``auth:<client address>``) has one row: when its window ends (the database
clock, so every replica agrees on it) and how many hits processes have taken of it. The window starts
with the first hit after the previous one ended. A process asks for a share of what is left and may get
less, or nothing once the window's hits are all taken; how large a share is, is its caller's rule
(``share``, passed in). The row's lock is held only for the one autocommit statement, and the table is
UNLOGGED, so the commit does not wait for a WAL flush.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.prepared import Prepared
from app.db.tables import rate_limit_counters as counters


@dataclass(frozen=True)
class Grant:
    """What one statement handed out: ``hits`` of the window (0: the window's limit is all taken) and
    ``seconds_left`` until the window ends, on the database clock."""

    hits: int
    seconds_left: float


_NOW = sa.func.now()
_EXPIRED = counters.c.window_end <= _NOW
_LEFT = sa.bindparam("limit", type_=sa.Integer) - counters.c.taken
# a share of what is left (at least 1), never more than is left (0 once the limit is taken)
_SHARE = sa.func.least(
    sa.func.greatest(_LEFT // sa.bindparam("share", type_=sa.Integer), 1), sa.func.greatest(_LEFT, 0)
)
_INSERT = insert(counters).values(
    name=sa.bindparam("name", type_=sa.Text),
    window_end=_NOW + sa.bindparam("length", type_=sa.Interval),
    taken=sa.bindparam("first", type_=sa.Integer),
    granted=sa.bindparam("first", type_=sa.Integer),
)
# INSERT INTO rate_limit_counters (name, window_end, taken, granted)
#   VALUES (:name, now() + :length, :first, :first)
# ON CONFLICT (name) DO UPDATE SET
#   window_end = CASE WHEN window_end <= now() THEN excluded.window_end ELSE window_end END,
#   taken = CASE WHEN window_end <= now() THEN excluded.taken ELSE taken + <share> END,
#   granted = CASE WHEN window_end <= now() THEN excluded.granted ELSE <share> END
# RETURNING granted, extract(epoch FROM window_end - now())
#   -- <share>: least(greatest((:limit - taken) / :share, 1), greatest(:limit - taken, 0))
# (every SET expression reads the row as it was: an ended window starts again with :first hits taken)
_TAKE = Prepared(
    _INSERT.on_conflict_do_update(
        index_elements=[counters.c.name],
        set_={
            "window_end": sa.case((_EXPIRED, _INSERT.excluded.window_end), else_=counters.c.window_end),
            "taken": sa.case((_EXPIRED, _INSERT.excluded.taken), else_=counters.c.taken + _SHARE),
            "granted": sa.case((_EXPIRED, _INSERT.excluded.granted), else_=_SHARE),
        },
    ).returning(counters.c.granted, sa.extract("epoch", counters.c.window_end - _NOW))
)


async def take(engine: AsyncEngine, name: str, limit: int, seconds: float, share: int) -> Grant:
    """Take hits of ``name``'s window (``limit`` hits per ``seconds``): ``max(1, left // share)`` of the
    ``left`` hits not yet taken, none once all are; a window that ended starts again with
    ``max(1, limit // share)`` taken. One autocommit statement."""
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        params = {
            "name": name,
            "length": timedelta(seconds=seconds),
            "first": max(1, limit // share),
            "limit": limit,
            "share": share,
        }
        hits, seconds_left = (await _TAKE.run(conn, params)).one()
    return Grant(int(hits), float(seconds_left))


async def prune(engine: AsyncEngine) -> int:
    """Delete the rows whose window has ended (a later hit would start its window again anyway); returns
    how many. Idempotent: replicas pruning at once delete each row once between them."""
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        # DELETE FROM rate_limit_counters WHERE window_end <= now()
        result = await conn.execute(sa.delete(counters).where(_EXPIRED))
    return result.rowcount
