"""Usage accounting (``GET /v1/usage``; docs/operating.md, "Usage accounting"): the atom-hours of device
bookings and the amount-hours of scalar holdings held over a period ``[from, to)``, split into regular and
spot work and grouped by tenant, pool, node or resource.

The stored windows are the truth: a release or a preemption cuts a booking's and a holding's end at its
instant and deletes one that had not started (:mod:`app.capacity.commit.cuts`), a repair cuts the old
allocation and books a new one, so what was held is exactly what is stored. Each window counts only its
part inside the period. Planned windows (``allocations.planned``: a pending reservation's plan) are not
usage. Two set-based aggregate statements (bookings, holdings) in exact ``numeric`` arithmetic, whatever
the number of bookings, plus a read of the database's clock when the period is not given whole.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import TSTZRANGE
from sqlalchemy.ext.asyncio import AsyncConnection

from app.answers.usage import UsageReport
from app.answers.usage_groups import UsageGroup
from app.db.tables import (
    TS,
    allocations,
    device_bookings,
    devices,
    nodes,
    pools,
    reservations,
    scalar_holdings,
)
from app.db.tx import reads
from app.db.windows import seconds_within
from app.errors import InvalidInput
from app.jsonnum import num

DEFAULT_SPAN = timedelta(days=30)
MAX_SPAN = timedelta(days=366)
SECONDS_PER_HOUR = 3600
DEVICE, SCALAR = "deviceHours", "scalarHours"

# (spec->>'spot')::boolean, absent: regular (the spot flag of docs/preemption.md)
SPOT = sa.func.coalesce(sa.cast(reservations.c.spec["spot"].astext, sa.Boolean), sa.false())


@dataclass(frozen=True, slots=True)
class UsageQuery:
    """What is asked: the period (``None``: the default, see :func:`resolve_period`), the grouping and
    the filters (``None``: every tenant, every pool)."""

    start: datetime | None = None
    end: datetime | None = None
    group: UsageGroup = UsageGroup.tenant
    tenant_id: str | None = None
    pool_id: str | None = None


def resolve_period(
    now: datetime | None, start: datetime | None, end: datetime | None
) -> tuple[datetime, datetime]:
    """``(from, to)`` in UTC: ``to`` defaults to ``now`` (the database's clock), ``from`` to 30 days
    before ``to``. InvalidInput (422) when ``to`` is not after ``from`` or the period is longer than 366
    days, at ``to`` when it was given, else at ``from``."""
    stop = (end or now or datetime.now(UTC)).astimezone(UTC)
    begin = (start or stop - DEFAULT_SPAN).astimezone(UTC)
    path = "to" if end is not None else "from"
    if stop <= begin:
        raise InvalidInput(
            f"{path}: to ({stop.isoformat()}) must be after from ({begin.isoformat()})", path=path
        )
    if stop - begin > MAX_SPAN:
        raise InvalidInput(f"{path}: the period spans at most 366 days", path=path)
    return begin, stop


def _group_keys(group: UsageGroup, pool_col: Any, node_col: Any, tenant_col: Any) -> tuple[list[Any], Any]:
    """The grouping's key columns (labelled by their answer field) and the join they need (or None)."""
    if group is UsageGroup.tenant:
        return [tenant_col.label("tenantId")], None
    if group is UsageGroup.pool:
        return [pools.c.id.label("poolId"), pools.c.name.label("poolName")], (pools, pools.c.id == pool_col)
    if group is UsageGroup.node:
        keys = [nodes.c.id.label("nodeId"), nodes.c.name.label("nodeName"), nodes.c.pool_id.label("poolId")]
        return keys, (nodes, nodes.c.id == node_col)
    return [], None


def _aggregate(
    source: Any,
    resource: Any,
    seconds: Any,
    where: Sequence[Any],
    keys: list[Any],
    join: Any,
) -> Any:
    """``SELECT <keys>, <resource> AS resource, spot, sum(<seconds>) / 3600 AS hours FROM <source> [JOIN
    <join>] WHERE <where> GROUP BY <keys>, resource, spot``."""
    if join is not None:
        source = source.join(*join)
    hours = sa.func.sum(seconds) / sa.literal(SECONDS_PER_HOUR, sa.Numeric)
    group = [*keys, resource, SPOT]
    return (
        sa.select(*keys, resource.label("resource"), SPOT.label("spot"), hours.label("hours"))
        .select_from(source)
        .where(*where)
        .group_by(*group)
    )


def _filters(asked: UsageQuery, pool_col: Any) -> list[Any]:
    where = [sa.not_(allocations.c.planned)]
    if asked.tenant_id is not None:
        where.append(reservations.c.tenant_id == asked.tenant_id)
    if asked.pool_id is not None:
        where.append(pool_col == asked.pool_id)
    return where


def device_hours(asked: UsageQuery, start: datetime, end: datetime) -> Any:
    """Atom-hours of the bookings overlapping ``[start, end)``, each cut to it::

    SELECT <keys>, d.class AS resource, coalesce((r.spec->>'spot')::boolean, false) AS spot,
           sum(extract(epoch FROM least(upper(b.during), :to) - greatest(lower(b.during), :from))) / 3600
      FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id
      JOIN reservations r ON r.id = a.reservation_id JOIN devices d ON d.pk = b.device_pk
     WHERE NOT a.planned AND b.during && tstzrange(:from, :to, '[)')
           [AND r.tenant_id = :tenant] [AND b.pool_id = :pool]
     GROUP BY <keys>, resource, spot
    """
    during = device_bookings.c.during
    lo, hi = sa.literal(start, TS), sa.literal(end, TS)
    seconds = seconds_within(sa.func.lower(during), sa.func.upper(during), lo, hi)
    source = (
        device_bookings.join(allocations, allocations.c.id == device_bookings.c.allocation_id)
        .join(reservations, reservations.c.id == allocations.c.reservation_id)
        .join(devices, devices.c.pk == device_bookings.c.device_pk)
    )
    keys, join = _group_keys(
        asked.group, device_bookings.c.pool_id, devices.c.node_id, reservations.c.tenant_id
    )
    asked_window = sa.func.tstzrange(lo, hi, "[)", type_=TSTZRANGE)
    where = [during.op("&&")(asked_window), *_filters(asked, device_bookings.c.pool_id)]
    return _aggregate(source, devices.c["class"], seconds, where, keys, join)


def scalar_hours(asked: UsageQuery, start: datetime, end: datetime) -> Any:
    """Amount-hours of the scalar holdings overlapping ``[start, end)``, each cut to it::

    SELECT <keys>, s.resource, coalesce((r.spec->>'spot')::boolean, false) AS spot,
           sum(s.amount * extract(epoch FROM least(s.ends_at, :to) - greatest(s.starts_at, :from))) / 3600
      FROM scalar_holdings s JOIN allocations a ON a.id = s.allocation_id
      JOIN reservations r ON r.id = a.reservation_id
     WHERE NOT a.planned AND s.ends_at > :from AND s.starts_at < :to
           [AND r.tenant_id = :tenant] [AND s.pool_id = :pool]
     GROUP BY <keys>, resource, spot
    """
    s = scalar_holdings
    lo, hi = sa.literal(start, TS), sa.literal(end, TS)
    seconds = s.c.amount * seconds_within(s.c.starts_at, s.c.ends_at, lo, hi)
    source = s.join(allocations, allocations.c.id == s.c.allocation_id).join(
        reservations, reservations.c.id == allocations.c.reservation_id
    )
    keys, join = _group_keys(asked.group, s.c.pool_id, s.c.node_id, reservations.c.tenant_id)
    where = [s.c.ends_at > lo, s.c.starts_at < hi, *_filters(asked, s.c.pool_id)]
    return _aggregate(source, s.c.resource, seconds, where, keys, join)


def _hours_maps() -> dict[str, dict[str, dict[str, Decimal]]]:
    return {
        DEVICE: defaultdict(lambda: {"regular": Decimal(0), "spot": Decimal(0)}),
        SCALAR: defaultdict(lambda: {"regular": Decimal(0), "spot": Decimal(0)}),
    }


def _numbers(maps: dict[str, dict[str, dict[str, Decimal]]]) -> dict[str, Any]:
    return {
        kind: {name: {k: num(v) for k, v in split.items()} for name, split in sorted(by.items())}
        for kind, by in maps.items()
    }


@reads
async def usage_report(conn: AsyncConnection, asked: UsageQuery) -> UsageReport:
    """The hours held over the asked period (:func:`resolve_period`), grouped by ``asked.group``, rows in
    key order (tenant id, pool id, node id or resource name); a group that held nothing has no row.
    InvalidInput (422 at ``from`` / ``to``) for a bad period; an unknown tenant or pool answers no rows."""
    now = None
    if asked.start is None or asked.end is None:
        now = (await conn.execute(sa.select(sa.func.now()))).scalar_one()
    start, end = resolve_period(now, asked.start, asked.end)
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    hours: dict[tuple[Any, ...], dict[str, dict[str, dict[str, Decimal]]]] = {}
    total = _hours_maps()
    for kind, statement in (
        (DEVICE, device_hours(asked, start, end)),
        (SCALAR, scalar_hours(asked, start, end)),
    ):
        for row in (await conn.execute(statement)).mappings():
            fields = {k: v for k, v in row.items() if k not in ("resource", "spot", "hours")}
            if asked.group is UsageGroup.resource:
                fields = {"resource": row["resource"]}
            key = tuple(fields.values())
            groups.setdefault(key, fields)
            split = "spot" if row["spot"] else "regular"
            hours.setdefault(key, _hours_maps())[kind][row["resource"]][split] += row["hours"]
            total[kind][row["resource"]][split] += row["hours"]
    rows = [{**groups[key], **_numbers(hours[key])} for key in sorted(groups)]
    return UsageReport.model_validate(
        {
            "from": start.isoformat(),
            "to": end.isoformat(),
            "groupBy": asked.group,
            "tenantId": asked.tenant_id,
            "poolId": asked.pool_id,
            "rows": rows,
            "total": _numbers(total),
        }
    )
