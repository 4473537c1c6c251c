"""``better-compute quota get TENANT POOL`` and ``quota set TENANT POOL gpu=8 cpu=64 ...``
(docs/cli.md, "Operator commands"; docs/quota.md): ``GET`` and ``PUT /v1/tenants/{t}/quotas/{pool}``.
``set`` replaces the tenant's limits in the pool, as the route does: a limit not given is dropped, and
the answer's warnings (one ``warning: ...`` line each on stderr) say which.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from app.client.api import ServiceClient
from app.client.common import Shown, assignments, client_command, warn
from app.client.flags import UsageError

quota_app = typer.Typer(help="Show or set a tenant's quota in a pool.", no_args_is_help=True)

TenantArg = Annotated[str, typer.Argument(metavar="TENANT", help="Tenant id.")]
PoolArg = Annotated[str, typer.Argument(metavar="POOL", help="Pool id (pool_...) or name.")]
# a 422 at limits.<name> names <name>=
QUOTA_FLAGS = {"limits": "RESOURCE=AMOUNT", "limits.*": "*="}


def quota_shown(quota: dict[str, Any]) -> Shown:
    """A tenant's quota in a pool, one row per resource."""
    from app.client import operator_views as views

    return Shown(quota, lambda wide: views.quota_view(quota, wide))


@quota_app.command("get")
@client_command()
def get_quota(api: ServiceClient, tenant: TenantArg, pool: PoolArg) -> Shown:
    """Limits, what is held now and the peak of the next 7 days, by resource."""
    return quota_shown(api.quota(tenant, api.pool_id(pool)))


@quota_app.command("set")
@client_command(QUOTA_FLAGS)
def set_quota(
    api: ServiceClient,
    tenant: TenantArg,
    pool: PoolArg,
    limits: Annotated[
        list[str] | None,
        typer.Argument(metavar="RESOURCE=AMOUNT...", help="Limits, e.g. gpu=8 cpu=64 memory=262144."),
    ] = None,
) -> Shown:
    """Replace the tenant's limits in the pool (a resource not given becomes unlimited; none: all)."""
    given = assignments(limits or [], "RESOURCE=AMOUNT")
    for name, amount in given.items():
        if not amount:
            raise UsageError(f"{name}=: give an amount (a number, 0 or more)")
    # the amounts go as decimal text (the route takes it): 0.1 stays 0.1, no float rounding
    quota = api.set_quota(tenant, api.pool_id(pool), dict(given))
    warn(quota)
    return quota_shown(quota)
