"""Core statements compiled once and run as prepared statements on the driver connection (issue 15).

SQLAlchemy Core stays the one source of the SQL: a :class:`Prepared` wraps a Core construct built only
from named bind parameters (and literals), compiles it once per dialect, and runs the compiled text
with ``exec_driver_sql`` (asyncpg prepares it once per connection and keeps it in its statement cache).
That skips SQLAlchemy's per-execution compile-cache lookup and parameter extraction, which a statement
with data-modifying CTEs also trips over (its cache key does not list the CTEs' literal binds in render
order). Bind values still go through each type's bind processor (JSONB, ranges, ...); result values are
the driver's (give array aggregates ``NullType``, counts come back as ``int``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection


class Prepared:
    """``Prepared(core_statement)``; ``await p.run(conn, {name: value})`` -> the driver's result."""

    def __init__(self, statement: Any) -> None:
        self.statement = statement
        self._compiled: tuple[str, list[tuple[str, Any, Callable[[Any], Any] | None]]] | None = None

    def compile(self, dialect: Dialect) -> tuple[str, list[tuple[str, Any, Callable[[Any], Any] | None]]]:
        """``(sql, [(name, literal value or None, bind processor)])`` in positional order (once)."""
        if self._compiled is None:
            compiled = self.statement.compile(dialect=dialect)
            processors = compiled._bind_processors
            binds = compiled.binds
            order = [
                (name, binds[name].value if binds[name].unique else None, processors.get(name))
                for name in compiled.positiontup or ()
            ]
            self._compiled = (str(compiled), order)
        return self._compiled

    def arguments(self, dialect: Dialect, params: Mapping[str, Any]) -> tuple[str, tuple[Any, ...]]:
        """The SQL text and its positional arguments for ``params`` (literals filled in)."""
        sql, order = self.compile(dialect)
        values = []
        for name, literal, process in order:
            value = params[name] if name in params else literal
            values.append(process(value) if process is not None and value is not None else value)
        return sql, tuple(values)

    async def run(self, conn: AsyncConnection, params: Mapping[str, Any]) -> Any:
        """Execute with ``params`` on ``conn`` (one round trip)."""
        sql, values = self.arguments(conn.dialect, params)
        return await conn.exec_driver_sql(sql, values)
