"""``better-compute audit``: the audit log, newest first (docs/cli.md; docs/operating.md, "Audit log").

``--since 1d`` asks for the events of the last day (``90m``, ``12h``, ``2w`` or seconds; measured on this
machine's clock), ``--actor`` one API key id or principal name, ``--resource`` one id (a path parameter
or a created resource). ``-o table|wide|json|yaml`` as every client command; an admin key is needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer

from app.client.api import ServiceClient
from app.client.common import Shown, client_command, duration_seconds, listed
from app.client.flags import UsageError

if TYPE_CHECKING:
    from rich.console import RenderableType

AUDIT_FLAGS: dict[str, str] = {
    "from": "--since",
    "actor": "--actor",
    "resource": "--resource",
    "limit": "--limit",
}


def since_time(since: str, now: datetime | None = None) -> datetime:
    """``now`` (default: this machine's clock, UTC) minus ``since`` (``90m``, ``12h``, ``1d``, ``2w`` or
    seconds); :class:`UsageError` naming ``--since`` otherwise."""
    seconds = duration_seconds(since)
    if not seconds:
        raise UsageError(f"--since {since!r}: give a duration such as 90m, 12h, 1d, 2w or seconds")
    try:
        return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    except OverflowError:
        raise UsageError(f"--since {since!r}: too far back") from None


def audit_view(events: list[Mapping[str, Any]], wide: bool) -> RenderableType:
    """One row per event: time, actor, operation, resources, status; ``wide`` adds the key, role, tenant,
    method and route, and the request id (rich is imported here: docs/cli.md, "Start-up")."""
    from rich.text import Text

    from app.client.render import EMPTY_CELL, joined, new_table, when

    if not events:
        return Text("no audit events")
    columns = ["at", "actor", "operation", "resources", "status"]
    if wide:
        columns += ["key", "role", "tenant", "route", "request"]
    table = new_table(*columns)
    for e in events:
        actor = e.get("actor") or {}
        row = [
            when(e.get("at")),
            str(actor.get("principal") or actor.get("keyId") or actor.get("role") or EMPTY_CELL),
            e["operationId"],
            joined(e.get("resources") or ()),
            str(e["status"]),
        ]
        if wide:
            row += [
                actor.get("keyId") or EMPTY_CELL,
                actor.get("role") or EMPTY_CELL,
                actor.get("tenantId") or EMPTY_CELL,
                f"{e['method']} {e['route']}",
                e.get("requestId") or EMPTY_CELL,
            ]
        table.add_row(*row)
    return table


@client_command(AUDIT_FLAGS)
def audit(
    api: ServiceClient,
    since: Annotated[
        str | None, typer.Option("--since", help="Only the last 90m, 12h, 1d, 2w (or seconds).")
    ] = None,
    actor: Annotated[str | None, typer.Option("--actor", help="Only this API key id or principal.")] = None,
    resource: Annotated[
        str | None, typer.Option("--resource", help="Only events naming this id (res_..., node_...).")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Show at most this many.")] = 100,
) -> Shown:
    """The audit log, newest first: who changed what, when, and the answer (admin keys)."""
    start = None if since is None else since_time(since).isoformat()
    rows = api.items("/v1/audit", {"from": start, "actor": actor, "resource": resource}, limit)
    return listed(rows, audit_view)
