"""``better-compute usage``: the GPU-hours and scalar-hours held over a period, in the manner of Slurm's
``sreport`` (``GET /v1/usage``; docs/cli.md, docs/operating.md "Usage accounting").

``--last 7d`` is the period up to the service's now (``from`` = this machine's now minus 7 days, ``to``
left to the service); ``--from``/``--to`` give it exactly (ISO 8601 with an offset); nothing: the
service's default, the last 30 days. ``--by tenant|pool|node|resource`` groups the rows; ``--pool`` and
``--tenant`` narrow them. The table prints one line per group and resource with its regular, spot and
total hours and the unit; ``-o json|yaml`` prints the service's answer as it came. Registered by
``app/cli.py``; a key needs ``compute:reservations:read`` (a tenant key reads its own tenant's).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any

import typer

from app.answers.usage_groups import UsageGroup
from app.client.api import ServiceClient, ServiceError
from app.client.common import Shown, client_command
from app.client.flags import UsageError

if TYPE_CHECKING:
    from rich.console import RenderableType

# API field -> the flag that set it, for a 422 (``INVALID_INPUT: --to: ...``)
USAGE_FLAGS = {"from": "--from", "to": "--to", "poolId": "--pool", "tenantId": "--tenant", "groupBy": "--by"}
# the unit of an hour of each known resource; others are "<name>-hours"
UNITS = {"gpu": "GPU-hours", "cpu": "core-hours", "memory": "MiB-hours"}
KEY_COLUMNS: dict[UsageGroup, tuple[tuple[str, str], ...]] = {
    UsageGroup.tenant: (("tenant", "tenantId"),),
    UsageGroup.pool: (("pool", "poolName"),),
    UsageGroup.node: (("node", "nodeName"),),
    UsageGroup.resource: (),
}
WIDE_KEY_COLUMNS: dict[UsageGroup, tuple[tuple[str, str], ...]] = {
    UsageGroup.pool: (("pool id", "poolId"),),
    UsageGroup.node: (("node id", "nodeId"), ("pool id", "poolId")),
}
ALL = "(all)"


def period_query(last: str | None, start: str | None, end: str | None, now: datetime) -> dict[str, str]:
    """The ``from``/``to`` query of the flags; :class:`UsageError` for ``--last`` with ``--from``/``--to``
    or a ``--last`` that is no duration (the service's own rule: ``90m``, ``2h``, ``7d``, seconds, at
    most 366 days). ``--from``/``--to`` are sent as typed: the service judges them (422 at the flag)."""
    from app.placement.request import parse_duration  # pydantic: only when --last is given

    if last is not None:
        if start is not None or end is not None:
            raise UsageError("--last is the period up to now: give it, or --from/--to, not both")
        try:
            seconds = parse_duration(last)
        except ValueError as error:
            raise UsageError(f"--last {last!r}: {error}") from None
        return {"from": (now - timedelta(seconds=seconds)).isoformat()}
    return {name: value for name, value in (("from", start), ("to", end)) if value is not None}


def hours_text(value: Any) -> str:
    """Hours to 0.001 h (3.6 s), trailing zeros dropped: ``4.5``, ``0.002``, ``12``."""
    text = f"{Decimal(str(value)).quantize(Decimal('0.001')):f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def unit(resource: str) -> str:
    return UNITS.get(resource, f"{resource}-hours")


def _lines(hours: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """``(resource, {regular, spot})`` of a row's or the total's hours: device classes, then scalars."""
    for kind in ("deviceHours", "scalarHours"):
        yield from hours.get(kind, {}).items()


def usage_view(answer: Mapping[str, Any], wide: bool, pool_name: str | None = None) -> RenderableType:
    """The period (and the pool asked for, by ``pool_name`` when known), then one line per group and
    resource (``REGULAR  SPOT  TOTAL  UNIT``) and the totals as ``(all)`` lines when there is more than
    one group (none by resource: each row is one resource's total); rich is imported here (docs/cli.md,
    "Start-up")."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from app.client.render import when

    group = UsageGroup(answer["groupBy"])
    keys = KEY_COLUMNS[group] + (WIDE_KEY_COLUMNS.get(group, ()) if wide else ())
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for name in (*(k for k, _ in keys), "resource", "regular", "spot", "total", "unit"):
        table.add_column(
            name.upper(), overflow="fold", justify="right" if name in ("regular", "spot", "total") else "left"
        )
    rows = [(row, [str(row.get(field) or "-") for _, field in keys]) for row in answer.get("rows", [])]
    if len(rows) != 1 and keys:  # by resource, each row is that resource's total already
        rows.append((answer.get("total", {}), [ALL for _ in keys]))
    for hours, cells in rows:
        for resource, split in _lines(hours):
            total = Decimal(str(split["regular"])) + Decimal(str(split["spot"]))
            table.add_row(
                *cells,
                resource,
                hours_text(split["regular"]),
                hours_text(split["spot"]),
                hours_text(total),
                unit(resource),
            )
    scope = [f"tenant {answer['tenantId']}" if answer.get("tenantId") else "every tenant"]
    scope.append(f"pool {pool_name or answer['poolId']}" if answer.get("poolId") else "every pool")
    title = Text(f"usage from {when(answer['from'])} to {when(answer['to'])}, {', '.join(scope)}, by {group}")
    if not answer.get("rows"):
        return Group(title, Text("nothing was held in the period"))
    return Group(title, table)


@client_command(USAGE_FLAGS)
def usage(
    api: ServiceClient,
    last: Annotated[
        str | None, typer.Option("--last", help="The period up to now: 90m, 12h, 7d, 30d (at most 366d).")
    ] = None,
    start: Annotated[
        str | None, typer.Option("--from", help="Period start, ISO 8601 with an offset.")
    ] = None,
    end: Annotated[
        str | None, typer.Option("--to", help="Period end (exclusive), ISO 8601 with an offset.")
    ] = None,
    pool: Annotated[str | None, typer.Option("--pool", help="Only this pool's usage (id or name).")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's usage.")] = None,
    by: Annotated[UsageGroup, typer.Option("--by", help="One row per tenant, pool, node or resource.")] = (
        UsageGroup.tenant
    ),
) -> Shown:
    """GPU-hours and cpu/memory-hours held over a period, regular and spot apart (default: the last 30
    days)."""
    query = period_query(last, start, end, datetime.now(UTC))
    pool_id, pool_name = usage_pool(api, pool) if pool is not None else (None, None)
    answer = api.get("/v1/usage", {**query, "poolId": pool_id, "tenantId": tenant, "groupBy": by.value})
    return Shown(answer, lambda wide: usage_view(answer, wide, pool_name))


def usage_pool(api: ServiceClient, ref: str) -> tuple[str, str | None]:
    """``(id, name)`` of the ``--pool`` given by id or name. The usage route answers no rows for a pool
    that does not exist (docs/api.md, "Usage"), so the pool is read first: one that no visible pool is,
    or an id that names none, is ``NOT_FOUND`` (exit 1) instead of a silent zero. An id the key may
    not read as a pool (403) is sent as it is (its name unknown): the route judges it."""
    if not ref.startswith("pool_"):
        return api.pool_id(ref), ref
    try:
        return ref, str(api.pool(ref)["name"])
    except ServiceError as error:
        if error.status != 403:
            raise
        return ref, None
