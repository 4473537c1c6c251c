"""Transaction helpers: run one service function in one transaction (or one read-only connection)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

T = TypeVar("T")


async def in_transaction(
    engine: AsyncEngine, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any
) -> T:
    """``fn(conn, *args, **kwargs)`` inside ``BEGIN ... COMMIT`` (rolled back when it raises)."""
    async with engine.begin() as conn:
        return await fn(conn, *args, **kwargs)


async def read_only(engine: AsyncEngine, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """``fn(conn, *args, **kwargs)`` on a connection whose work is rolled back afterwards."""
    async with engine.connect() as conn:
        conn: AsyncConnection
        try:
            return await fn(conn, *args, **kwargs)
        finally:
            await conn.rollback()
