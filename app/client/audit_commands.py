"""``better-compute audit``: the audit log, newest first (docs/cli.md; docs/operating.md, "Audit log").

``--since 1d`` asks for the events of the last day (``90m``, ``12h``, ``2w`` or seconds; measured on this
machine's clock), ``--actor`` one API key id or principal name, ``--resource`` one id (a path parameter
or a created resource). ``-o table|wide|json|yaml`` as every client command; an admin key is needed.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from app.client import EXIT_API_ERROR, EXIT_USAGE
from app.client.api import DEFAULT_SERVER, ServiceClient, ServiceError, Unreachable
from app.client.flags import UsageError, with_flag
from app.client.render import EMPTY_CELL, Output, emit, joined, when

AUDIT_FLAGS: dict[str, str] = {
    "from": "--since",
    "actor": "--actor",
    "resource": "--resource",
    "limit": "--limit",
}
_DURATION = re.compile(r"([0-9]+)([smhdw]?)")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def since_time(since: str, now: datetime | None = None) -> datetime:
    """``now`` (default: this machine's clock, UTC) minus ``since`` (``90m``, ``12h``, ``1d``, ``2w`` or
    seconds); :class:`UsageError` naming ``--since`` otherwise."""
    found = _DURATION.fullmatch(since.strip())
    if found is None or int(found[1]) == 0:
        raise UsageError(f"--since {since!r}: give a duration such as 90m, 12h, 1d, 2w or seconds")
    seconds = int(found[1]) * _UNIT_SECONDS[found[2]]
    try:
        return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    except OverflowError:
        raise UsageError(f"--since {since!r}: too far back") from None


def _actor(event: Mapping[str, Any]) -> str:
    actor = event.get("actor") or {}
    return str(actor.get("principal") or actor.get("keyId") or actor.get("role") or EMPTY_CELL)


def audit_view(events: list[Mapping[str, Any]], wide: bool) -> RenderableType:
    """One row per event: time, actor, operation, resources, status; ``wide`` adds the key, role, tenant,
    method and route, and the request id."""
    if not events:
        return Text("no audit events")
    columns = ["at", "actor", "operation", "resources", "status"]
    if wide:
        columns += ["key", "role", "tenant", "route", "request"]
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column.upper(), overflow="fold")
    for e in events:
        row = [
            when(e.get("at")),
            _actor(e),
            e["operationId"],
            joined(e.get("resources") or ()),
            str(e["status"]),
        ]
        if wide:
            actor = e.get("actor") or {}
            row += [
                actor.get("keyId") or EMPTY_CELL,
                actor.get("role") or EMPTY_CELL,
                actor.get("tenantId") or EMPTY_CELL,
                f"{e['method']} {e['route']}",
                e.get("requestId") or EMPTY_CELL,
            ]
        table.add_row(*row)
    return table


def audit(
    since: Annotated[
        str | None, typer.Option("--since", help="Only the last 90m, 12h, 1d, 2w (or seconds).")
    ] = None,
    actor: Annotated[str | None, typer.Option("--actor", help="Only this API key id or principal.")] = None,
    resource: Annotated[
        str | None, typer.Option("--resource", help="Only events naming this id (res_..., node_...).")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Show at most this many.")] = 100,
    output: Annotated[Output, typer.Option("-o", "--output", help="Output format.")] = Output.table,
    server: Annotated[
        str, typer.Option("--server", envvar="BC_SERVER", help="Service URL.", show_default=True)
    ] = DEFAULT_SERVER,
    key: Annotated[
        str | None, typer.Option("--key", envvar="BC_API_KEY", help="API key.", show_default=False)
    ] = None,
) -> None:
    """The audit log, newest first: who changed what, when, and the answer (admin keys)."""
    if not key:
        raise _fail("an API key is needed: --key or BC_API_KEY", EXIT_USAGE)
    if not server.startswith(("http://", "https://")):
        raise _fail(f"--server {server!r}: give an http:// or https:// URL", EXIT_USAGE)
    try:
        start = None if since is None else since_time(since).isoformat()
        with ServiceClient(server, key) as api:
            rows = api.items("/v1/audit", {"from": start, "actor": actor, "resource": resource}, limit)
    except UsageError as error:
        raise _fail(error.message, EXIT_USAGE) from None
    except Unreachable as error:
        raise _fail(error.message, EXIT_API_ERROR) from None
    except ServiceError as error:
        message = with_flag(error.message, str(error.details.get("path", "")), AUDIT_FLAGS)
        raise _fail(f"{error.code}: {message}", EXIT_API_ERROR) from None
    console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 10_000)
    emit(console, {"items": rows}, output, lambda wide: audit_view(rows, wide))


def _fail(message: str, code: int) -> typer.Exit:
    """One plain line on stderr and the exit, as every client command (app/cli.py)."""
    typer.echo(message, err=True)
    return typer.Exit(code)
