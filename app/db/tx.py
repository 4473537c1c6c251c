"""Units of work: the service layer opens every transaction, routers never do (docs/architecture.md).

A service entry point is decorated with :func:`transaction` (it writes) or :func:`reads` (it only reads)
and takes ``db``, an :class:`AsyncEngine` or an :class:`AsyncConnection`, as its first argument:

- called with the **engine** (a route, the CLI), it is its own unit of work: :func:`transaction` runs it
  in ``BEGIN ... COMMIT`` (rolled back when it raises), :func:`reads` on one connection whose work is
  rolled back afterwards;
- called with a **connection**, it joins the caller's transaction: a larger unit of work (an agent's
  Hello registers a node with :func:`app.inventory.service.add_node`) or a race test holding a lock.

:func:`in_transaction` and :func:`read_only` run any ``fn(conn, ...)`` the same way, for service code
that composes steps of several modules.

A unit of work that PostgreSQL chose as a deadlock's victim (40P01: everything it did is rolled back) is
run again, up to :data:`DEADLOCK_ATTEMPTS` times, instead of answering 500: for example a cordon whose
pool row lock waits on a batch that waits on the cordon's node (found by the pool-lease race test).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db.audit import note_answer

T = TypeVar("T")
P = ParamSpec("P")

Db = AsyncEngine | AsyncConnection  # what a service entry point takes first
DEADLOCK = "40P01"
DEADLOCK_ATTEMPTS = 3


def sqlstate(exc: DBAPIError) -> str | None:
    """The PostgreSQL SQLSTATE of a driver error (``40P01``, ``23P01``, ``23503``, ...), if any."""
    orig = exc.orig
    return getattr(orig, "sqlstate", None) or getattr(getattr(orig, "__cause__", None), "sqlstate", None)


def run_again_on_deadlock(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """``fn`` (which opens its own transaction and keeps nothing outside it) run again when PostgreSQL
    picked its transaction as a deadlock's victim (40P01: all of it was rolled back), up to
    :data:`DEADLOCK_ATTEMPTS` times; the last attempt's error is raised. For the service entry points
    that open their transaction themselves (a reservation's create and release)."""

    @functools.wraps(fn)
    async def again(*args: P.args, **kwargs: P.kwargs) -> T:
        for attempt in range(1, DEADLOCK_ATTEMPTS + 1):
            try:
                return await fn(*args, **kwargs)
            except DBAPIError as exc:
                if sqlstate(exc) != DEADLOCK or attempt == DEADLOCK_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    return again


@run_again_on_deadlock
async def in_transaction(
    engine: AsyncEngine, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any
) -> T:
    """``fn(conn, *args, **kwargs)`` inside ``BEGIN ... COMMIT`` (rolled back when it raises); run again
    when the transaction was a deadlock's victim (:func:`run_again_on_deadlock`)."""
    async with engine.begin() as conn:
        answer = await fn(conn, *args, **kwargs)
        note_answer(answer)  # a create's id for the request's audit row, written at COMMIT (app/db/audit.py)
        return answer


async def read_only(engine: AsyncEngine, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """``fn(conn, *args, **kwargs)`` on a connection whose work is rolled back afterwards."""
    async with engine.connect() as conn:
        conn: AsyncConnection
        try:
            return await fn(conn, *args, **kwargs)
        finally:
            await conn.rollback()


def transaction(
    fn: Callable[Concatenate[AsyncConnection, P], Awaitable[T]],
) -> Callable[Concatenate[Db, P], Awaitable[T]]:
    """A writing service entry point: given the engine, ``fn`` runs in its own transaction
    (:func:`in_transaction`); given a connection, in the caller's."""
    return _entry(fn, in_transaction)


def reads(
    fn: Callable[Concatenate[AsyncConnection, P], Awaitable[T]],
) -> Callable[Concatenate[Db, P], Awaitable[T]]:
    """A reading service entry point: given the engine, ``fn`` runs on a connection of its own that is
    rolled back afterwards (:func:`read_only`); given a connection, in the caller's transaction."""
    return _entry(fn, read_only)


def _entry(
    fn: Callable[Concatenate[AsyncConnection, P], Awaitable[T]],
    own_unit: Callable[..., Awaitable[T]],
) -> Callable[Concatenate[Db, P], Awaitable[T]]:
    @functools.wraps(fn)
    async def entry(db: Db, /, *args: P.args, **kwargs: P.kwargs) -> T:
        if isinstance(db, AsyncEngine):
            return await own_unit(db, fn, *args, **kwargs)
        return await fn(db, *args, **kwargs)

    return entry
