"""Amounts held over half-open windows ``[starts_at, ends_at)``, counted per instant (docs/lifecycle.md):
the SQL shared by ``scalar_holdings`` (a node's cpu, memory, ...) and
``quota_holdings`` (a tenant's usage of a pool).

The amount held at an instant ``t`` is the sum of the rows with ``starts_at <= t < ends_at``. The peak over
a window ``[s, e)`` is the maximum of that over ``t`` in the window. It is found with one sweep over the
rows that overlap the window, ``O(k log k)`` for ``k`` such rows (rows wholly before or after the window
are skipped by the ``(..., ends_at)`` indexes and the ``starts_at < e`` filter)::

    SELECT max(held) FROM (
      SELECT sum(delta) OVER (ORDER BY at, delta) AS held FROM (
        SELECT greatest(starts_at, :s) AS at, amount AS delta FROM h
         WHERE <keys> AND ends_at > :s AND starts_at < :e
        UNION ALL
        SELECT ends_at, -amount FROM h
         WHERE <keys> AND ends_at > :s AND starts_at < :e AND ends_at < :e
      ) events
    ) running

At one instant, ends (negative deltas) sort before starts: the windows are half-open, so a holding that
ends at 12:00 and one that starts at 12:00 are never held together. The running sum after the last event
of an instant is what is held from that instant on, and a running sum in the middle of an instant's
events is never above both neighbours' values, so the maximum of the running sums is the peak.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import Range
from sqlalchemy.ext.asyncio import AsyncConnection


def window(start: datetime, end: datetime) -> Range[datetime]:
    """The half-open booking window ``[start, end)``."""
    return Range(start, end, bounds="[)")


def windows_apart(keys: Iterable[tuple[Any, ...]]) -> bool:
    """Whether, per holder, the distinct windows of ``keys`` (``(*holder, start, end)``, each once) are
    pairwise apart. Then one guard per (holder, window) with the window's total is exact, as no row of one
    window counts in another's peak (the batch's scalar holds and quota charges). Sorted by start,
    windows are apart when each starts at or after the end of the one before."""
    by_holder: dict[tuple[Any, ...], list[tuple[Any, Any]]] = defaultdict(list)
    for *holder, start, end in keys:
        by_holder[tuple(holder)].append((start, end))
    for windows in by_holder.values():
        windows.sort()
        if any(later[0] < earlier[1] for earlier, later in zip(windows, windows[1:], strict=False)):
            return False
    return True


def overlapping(table: sa.Table, start: datetime, end: datetime) -> list[Any]:
    """The rows of ``table`` whose window overlaps ``[start, end)``."""
    return [table.c.ends_at > start, table.c.starts_at < end]


def seconds_within(starts_at: Any, ends_at: Any, start: Any, end: Any) -> Any:
    """``extract(epoch FROM least(ends_at, :end) - greatest(starts_at, :start))``: the seconds of the
    window ``[starts_at, ends_at)`` inside ``[start, end)``, for a window that overlaps it (usage
    accounting's hours, app/capacity/reservations/usage.py)."""
    return sa.extract("epoch", sa.func.least(ends_at, end) - sa.func.greatest(starts_at, start))


def holdings_over(table: sa.Table, start: Any, end: Any, *where: Any, keys: Sequence[Any] = ()) -> Any:
    """``SELECT <keys>, resource, amount, starts_at, ends_at FROM table WHERE <where> AND ends_at > :start
    AND starts_at < :end``: the holdings of ``table`` (``scalar_holdings``, ``quota_holdings``) that
    overlap ``[start, end)``, for a reader that sweeps them itself (earliest start, preemption)."""
    return sa.select(*keys, table.c.resource, table.c.amount, table.c.starts_at, table.c.ends_at).where(
        *where, *overlapping(table, start, end)
    )


def _running(
    table: sa.Table,
    where: Sequence[Any],
    start: datetime,
    end: datetime,
    keys: Sequence[Any],
    outer: Sequence[Any] = (),
) -> Any:
    """Subquery ``(keys..., at, held)``: the running sum of the sweep over the window, per key.
    ``outer``: FROM items of an enclosing statement that ``where`` refers to (correlated, not joined)."""
    rows = [*where, *overlapping(table, start, end)]
    starts = (
        sa.select(
            *keys, sa.func.greatest(table.c.starts_at, start).label("at"), table.c.amount.label("delta")
        )
        .where(*rows)
        .correlate(*outer)
    )
    ends = (
        sa.select(*keys, table.c.ends_at.label("at"), (-table.c.amount).label("delta"))
        .where(*rows, table.c.ends_at < end)
        .correlate(*outer)
    )
    events = sa.union_all(starts, ends).subquery("events")
    key_cols = [events.c[k.key] for k in keys]
    return sa.select(
        *key_cols,
        events.c.at,
        sa.func.sum(events.c.delta)
        .over(partition_by=key_cols or None, order_by=(events.c.at, events.c.delta))
        .label("held"),
    ).subquery("running")


def peak_over(
    table: sa.Table, where: Sequence[Any], start: datetime, end: datetime, outer: Sequence[Any] = ()
) -> Any:
    """Scalar subquery: the peak held over ``[start, end)`` by the rows matching ``where`` (0 if none);
    ``outer`` as in :func:`room_for`."""
    running = _running(table, where, start, end, (), outer)
    return sa.select(sa.func.coalesce(sa.func.max(running.c.held), 0)).scalar_subquery()


def room_for(
    table: sa.Table,
    where: Sequence[Any],
    start: datetime,
    end: datetime,
    n: Any,
    cap: Any,
    outer: Sequence[Any] = (),
) -> Any:
    """The guard "the peak held over ``[start, end)`` plus ``n`` stays within ``cap``" (``cap`` NULL: no
    limit), as a boolean SQL expression that does the sweep only when it must::

        CASE WHEN cap IS NULL THEN true
             WHEN (SELECT coalesce(sum(amount), 0) FROM h WHERE <overlapping>) + n <= cap THEN true
             ELSE (<peak over the window>) + n <= cap END

    The sum of every overlapping holding is at least the peak, so when it fits the peak fits too; CASE
    evaluates its branches in order, so the sort of the sweep is skipped then. ``outer``: FROM items of
    the enclosing statement that ``where``, ``n`` or ``cap`` refer to (e.g. one row per resource of a
    batch), correlated in every subquery of the sweep instead of joined there."""
    total = (
        sa.select(sa.func.coalesce(sa.func.sum(table.c.amount), 0))
        .where(*where, *overlapping(table, start, end))
        .scalar_subquery()
    )
    return sa.case(
        (cap.is_(None), sa.true()),
        (total + n <= cap, sa.true()),
        else_=peak_over(table, where, start, end, outer) + n <= cap,
    )


def peaks_by(
    table: sa.Table, where: Sequence[Any], start: datetime, end: datetime, keys: Sequence[Any]
) -> Any:
    """Subquery ``(keys..., peak)``: the peak over ``[start, end)`` per key (keys without rows absent)."""
    running = _running(table, where, start, end, keys)
    key_cols = [running.c[k.key] for k in keys]
    return (
        sa.select(*key_cols, sa.func.max(running.c.held).label("peak")).group_by(*key_cols).subquery("peaks")
    )


async def peak_instant(
    conn: AsyncConnection, table: sa.Table, where: Sequence[Any], start: datetime, end: datetime
) -> tuple[datetime, Any]:
    """``(instant, held)`` of the first instant in ``[start, end)`` where the peak is held (``(start, 0)``
    when nothing is held)."""
    running = _running(table, where, start, end, ())
    row = (
        await conn.execute(
            sa.select(running.c.at, running.c.held).order_by(running.c.held.desc(), running.c.at).limit(1)
        )
    ).first()
    if row is None or row.held <= 0:
        return start, 0
    return row.at, row.held


async def held_at(
    conn: AsyncConnection, table: sa.Table, where: Sequence[Any], instant: Any, keys: Sequence[Any]
) -> dict[tuple[Any, ...], Decimal]:
    """What the rows of ``table`` matching ``where`` hold at one instant, by the values of ``keys`` (a
    tuple, one value per key; keys holding nothing are absent)::

        SELECT keys..., sum(amount) AS held FROM table WHERE <where> AND starts_at <= :t AND ends_at > :t
         GROUP BY keys
    """
    statement = (
        sa.select(*keys, sa.func.sum(table.c.amount).label("held"))
        .where(*where, table.c.starts_at <= instant, table.c.ends_at > instant)
        .group_by(*keys)
    )
    return {tuple(r[: len(keys)]): r.held for r in (await conn.execute(statement)).all()}


def holding_params(table: sa.Table) -> dict[str, Any]:
    """One bind parameter per column of a holdings table, named and typed as the column: statements
    built once from them (at import) are compiled once and then only executed with values."""
    return {c.name: sa.bindparam(c.name, type_=c.type) for c in table.columns}


def hold_if(table: sa.Table, values: Mapping[str, Any], *guard: Any, returning: Sequence[str] = ()) -> Any:
    """``INSERT INTO table (<columns>) SELECT <values> FROM <the tables they and the guard name> WHERE
    <guard> RETURNING <returning, default the first column>``: the guarded write of holdings, one row or
    many (``values`` taken from an ``unnest`` of rows, :mod:`app.db.unnest`); a row not returned = the
    guard refused it. ``values`` are SQL expressions (e.g. :func:`holding_params`) or plain values."""
    columns = list(values)
    source = sa.select(
        *(v if isinstance(v, sa.ColumnElement) else sa.literal(v, table.c[c].type) for c, v in values.items())
    ).where(*guard)
    back = [table.c[c] for c in returning or columns[:1]]
    return sa.insert(table).from_select(columns, source).returning(*back)


async def cut(conn: AsyncConnection, table: sa.Table, where: Sequence[Any], at: datetime) -> None:
    """Cut the rows matching ``where`` at the instant ``at``: rows that start at or after it are deleted
    (nothing was held), rows that contain it end there (what was held stays as history)::

        DELETE FROM h WHERE <where> AND starts_at >= :at;
        UPDATE h SET ends_at = :at WHERE <where> AND starts_at < :at AND ends_at > :at;
    """
    await conn.execute(sa.delete(table).where(*where, table.c.starts_at >= at))
    await conn.execute(
        sa.update(table).where(*where, table.c.starts_at < at, table.c.ends_at > at).values(ends_at=at)
    )
