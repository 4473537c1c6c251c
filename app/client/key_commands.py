"""``better-compute key create|list|revoke``: API keys of a running service (docs/cli.md, "Keys";
docs/operating.md, "Keys").

``key_app(service, console)`` builds the group that ``app/cli.py`` mounts as ``better-compute key``; it
is handed the CLI's ``service`` context manager (exits and error lines) and console, so the commands
stay as thin as the others. ``--role`` names a set of grants (:data:`ROLES`), ``--expires`` takes a
duration from now (``30d``) or an ISO 8601 time with its offset.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from app.client import render as out
from app.client.api import DEFAULT_SERVER, ServiceClient
from app.client.flags import UsageError
from app.client.render import EMPTY_CELL, Output

Service = Callable[..., AbstractContextManager[ServiceClient]]

# API field path -> the flag that set it (errors name the flag)
KEY_FLAGS = {"principal": "--name", "tenantId": "--tenant", "grants": "--role", "expiresAt": "--expires"}
DURATION = re.compile(r"^(\d+)([smhdw])$")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class Role(StrEnum):
    """The ``--role`` choices (:func:`role_grants`)."""

    admin = "admin"
    user = "user"
    reader = "reader"


def role_grants(role: Role, tenant: str | None) -> list[dict[str, str]]:
    """The grants of ``role`` for ``tenant`` (None: every tenant). ``reader``: read the tenant's
    reservations, preview and read inventory in every pool; ``user``: also create and release
    reservations; ``admin``: without a tenant every action on everything (an admin key), with one a
    ``user`` that also administers the tenant's keys (``compute:iam:admin`` on ``tenant:<T>``)."""
    if role is Role.admin and tenant is None:
        return [{"action": "*", "resource": "*"}]
    scope = f"tenant:{tenant}" if tenant else "tenant:*"
    reservations = "compute:reservations:read" if role is Role.reader else "compute:reservations:*"
    pairs = [
        (reservations, scope),
        (reservations, "pool:*"),
        ("compute:capacity:read", "pool:*"),
        ("compute:inventory:read", "pool:*"),
    ]
    if role is Role.admin:
        pairs.append(("compute:iam:admin", scope))
    return [{"action": a, "resource": r} for a, r in pairs]


def expires_at(value: str, now: datetime) -> str:
    """``--expires``: a duration from ``now`` (``90m``, ``12h``, ``30d``, ``2w``, ``3600s``) as an ISO 8601
    time in UTC, or the text itself (the service checks an ISO 8601 time and names ``--expires``).
    Raises :class:`UsageError` for a zero duration."""
    matched = DURATION.match(value.strip())
    if matched is None:
        return value
    seconds = int(matched.group(1)) * UNIT_SECONDS[matched.group(2)]
    if seconds <= 0:
        raise UsageError(f"--expires {value!r}: a duration must be more than 0")
    return (now + timedelta(seconds=seconds)).isoformat()


def _table(*columns: str) -> Table:
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column.upper(), overflow="fold")
    return table


def key_status(key: Mapping[str, Any], now: datetime) -> str:
    """``revoked``, ``expired`` (its ``expiresAt`` passed by this machine's clock) or ``active``."""
    if key.get("revokedAt"):
        return "revoked"
    if key.get("expiresAt") and datetime.fromisoformat(key["expiresAt"]) <= now:
        return "expired"
    return "active"


def grants_text(grants: list[Mapping[str, str]] | None) -> str:
    """``action on resource, ...``, or ``-``."""
    return ", ".join(f"{g['action']} on {g['resource']}" for g in grants or ()) or EMPTY_CELL


def keys_view(keys: list[Mapping[str, Any]], wide: bool, now: datetime) -> RenderableType:
    """One row per key: id, principal, tenant, status, expiry, last use; ``wide`` adds the creation
    time, the revocation time and the grants."""
    if not keys:
        return Text("no keys")
    extra = ["created", "revoked", "grants"] if wide else []
    table = _table("id", "principal", "tenant", "status", "expires", "last used", *extra)
    for k in keys:
        row = [k["id"], k["principal"], k.get("tenantId") or EMPTY_CELL, key_status(k, now)]
        row += [out.when(k.get("expiresAt")), out.when(k.get("lastUsedAt"))]
        if wide:
            row += [out.when(k.get("createdAt")), out.when(k.get("revokedAt")), grants_text(k.get("grants"))]
        table.add_row(*row)
    return table


def created_view(key: Mapping[str, Any], wide: bool) -> RenderableType:
    """The new key's row, then its secret on a line of its own (shown this once)."""
    table = _table("id", "principal", "tenant", "expires")
    table.add_row(
        key["id"], key["principal"], key.get("tenantId") or EMPTY_CELL, out.when(key.get("expiresAt"))
    )
    return Group(table, Text(f"key (shown once, store it now): {key['key']}"))


ServerOpt = Annotated[
    str, typer.Option("--server", envvar="BC_SERVER", help="Service URL.", show_default=True)
]
KeyOpt = Annotated[
    str | None, typer.Option("--key", envvar="BC_API_KEY", help="API key.", show_default=False)
]
OutputOpt = Annotated[Output, typer.Option("-o", "--output", help="Output format.")]


def key_app(service: Service, console: Callable[[], Console]) -> typer.Typer:
    """The ``key`` command group; ``service(server, key, flags)`` opens a client and turns failures into
    exits (``app/cli.py``), ``console()`` the console that prints."""
    group = typer.Typer(help="Create, list and revoke API keys.", no_args_is_help=True)

    @group.command("create")
    def create(
        tenant: Annotated[str | None, typer.Option("--tenant", help="The tenant the key acts for.")] = None,
        role: Annotated[Role, typer.Option("--role", help="The grants: admin, user or reader.")] = Role.user,
        expires: Annotated[
            str | None, typer.Option("--expires", help="A duration from now (30d, 12h) or an ISO 8601 time.")
        ] = None,
        name: Annotated[
            str | None, typer.Option("--name", help="Principal name (default: the role).")
        ] = None,
        output: OutputOpt = Output.table,
        server: ServerOpt = DEFAULT_SERVER,
        key: KeyOpt = None,
    ) -> None:
        """Create a key (its secret is printed this once)."""
        with service(server, key, KEY_FLAGS) as api:
            body: dict[str, Any] = {
                "principal": name or (f"{tenant}-{role.value}" if tenant else role.value),
                "tenantId": tenant,
                "grants": role_grants(role, tenant),
            }
            if expires is not None:
                body["expiresAt"] = expires_at(expires, datetime.now(UTC))
            answer = api.request("POST", "/v1/api-keys", body=body)[1]
            out.emit(console(), answer, output, lambda wide: created_view(answer, wide))

    @group.command("list")
    def list_keys(
        limit: Annotated[
            int | None, typer.Option("--limit", min=1, help="Show at most this many (default: all).")
        ] = None,
        output: OutputOpt = Output.table,
        server: ServerOpt = DEFAULT_SERVER,
        key: KeyOpt = None,
    ) -> None:
        """List the keys this key may see, newest first (never a secret)."""
        with service(server, key) as api:
            rows = api.items("/v1/api-keys", limit=limit)
            now = datetime.now(UTC)
            out.emit(console(), {"items": rows}, output, lambda wide: keys_view(rows, wide, now))

    @group.command("revoke")
    def revoke(
        key_id: Annotated[str, typer.Argument(metavar="KEY_ID", help="Key id (key_...).")],
        server: ServerOpt = DEFAULT_SERVER,
        key: KeyOpt = None,
    ) -> None:
        """Revoke a key: it is refused from now on (401)."""
        with service(server, key) as api:
            api.request("DELETE", f"/v1/api-keys/{key_id}")
        console().print(f"revoked {key_id}", markup=False, highlight=False)

    return group
