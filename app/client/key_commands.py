"""``better-compute key create|list|revoke``: API keys of a running service (docs/cli.md, "Keys";
docs/operating.md, "Keys").

``key_app`` is the group that ``app/cli.py`` mounts as ``better-compute key``. ``--role`` names a set of
grants (:class:`Role`), ``--expires`` takes a duration from now (``30d``) or an ISO 8601 time with its
offset. The tables are :mod:`app.client.operator_views`'.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any

import typer

from app.client.api import ServiceClient
from app.client.common import LimitOpt, Shown, client_command, console, duration_seconds, listed
from app.client.flags import UsageError, iso_time

# API field path -> the flag that set it (errors name the flag)
KEY_FLAGS = {"principal": "--name", "tenantId": "--tenant", "grants": "--role", "expiresAt": "--expires"}

key_app = typer.Typer(help="Create, list and revoke API keys.", no_args_is_help=True)


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
    time in UTC, or an ISO 8601 time as typed (the service checks its offset and that it is in the
    future, naming ``--expires``). Raises :class:`UsageError` for a zero duration, one past year 9999,
    or neither form."""
    seconds = duration_seconds(value, unit_required=True)
    if seconds is None:
        return iso_time(value, "--expires", "a duration from now (90m, 12h, 30d, 2w) or ")
    if seconds <= 0:
        raise UsageError(f"--expires {value!r}: a duration must be more than 0")
    try:
        return (now + timedelta(seconds=seconds)).isoformat()
    except OverflowError:
        raise UsageError(f"--expires {value!r}: too far ahead (past year 9999)") from None


@key_app.command("create")
@client_command(KEY_FLAGS)
def create(
    api: ServiceClient,
    tenant: Annotated[str | None, typer.Option("--tenant", help="The tenant the key acts for.")] = None,
    role: Annotated[Role, typer.Option("--role", help="The grants: admin, user or reader.")] = Role.user,
    expires: Annotated[
        str | None, typer.Option("--expires", help="A duration from now (30d, 12h) or an ISO 8601 time.")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Principal name (default: the role).")] = None,
) -> Shown:
    """Create a key (its secret is printed this once)."""
    from app.client import operator_views as views

    body: dict[str, Any] = {
        "principal": name or (f"{tenant}-{role.value}" if tenant else role.value),
        "tenantId": tenant,
        "grants": role_grants(role, tenant),
    }
    if expires is not None:
        body["expiresAt"] = expires_at(expires, datetime.now(UTC))
    answer = api.request("POST", "/v1/api-keys", body=body)[1]
    return Shown(answer, lambda wide: views.created_key_view(answer, wide))


@key_app.command("list")
@client_command()
def list_keys(api: ServiceClient, limit: LimitOpt = None) -> Shown:
    """List the keys this key may see, newest first (never a secret)."""
    from app.client import operator_views as views

    rows = api.items("/v1/api-keys", limit=limit)
    now = datetime.now(UTC)
    return listed(rows, lambda rows, wide: views.keys_view(rows, wide, now))


@key_app.command("revoke")
@client_command(output=False)
def revoke(
    api: ServiceClient, key_id: Annotated[str, typer.Argument(metavar="KEY_ID", help="Key id (key_...).")]
) -> None:
    """Revoke a key: it is refused from now on (401)."""
    api.request("DELETE", f"/v1/api-keys/{key_id}")
    console().print(f"revoked {key_id}", markup=False, highlight=False)
