"""``better-compute quota get TENANT POOL`` and ``quota set TENANT POOL gpu=8 cpu=64 ...``
(docs/cli.md, "Operator commands"; docs/quota.md): ``GET`` and ``PUT /v1/tenants/{t}/quotas/{pool}``.
``set`` replaces the tenant's limits in the pool, as the route does: a limit not given is dropped, and
the answer's warnings (one ``warning: ...`` line each on stderr) say which.
"""

from __future__ import annotations

from typing import Annotated

import typer

from app.client.api import DEFAULT_SERVER
from app.client.common import KeyOpt, Output, OutputOpt, ServerOpt, assignments, emit, service, warn
from app.client.flags import UsageError

quota_app = typer.Typer(help="Show or set a tenant's quota in a pool.", no_args_is_help=True)

TenantArg = Annotated[str, typer.Argument(metavar="TENANT", help="Tenant id.")]
PoolArg = Annotated[str, typer.Argument(metavar="POOL", help="Pool id (pool_...) or name.")]


@quota_app.command("get")
def get_quota(
    tenant: TenantArg,
    pool: PoolArg,
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """Limits, what is held now and the peak of the next 7 days, by resource."""
    from app.client import operator_views as views

    with service(server, key) as api:
        quota = api.quota(tenant, api.pool_id(pool))
        emit(quota, output, lambda wide: views.quota_view(quota, wide))


@quota_app.command("set")
def set_quota(
    tenant: TenantArg,
    pool: PoolArg,
    limits: Annotated[
        list[str] | None,
        typer.Argument(metavar="RESOURCE=AMOUNT...", help="Limits, e.g. gpu=8 cpu=64 memory=262144."),
    ] = None,
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """Replace the tenant's limits in the pool (a resource not given becomes unlimited; none: all)."""
    from app.client import operator_views as views

    flags = {"limits": "RESOURCE=AMOUNT"}  # a 422 at limits.<name> names <name>= (filled in below)
    with service(server, key, flags) as api:
        given = assignments(limits or [], "RESOURCE=AMOUNT")
        for name, amount in given.items():
            if not amount:
                raise UsageError(f"{name}=: give an amount (a number, 0 or more)")
        flags.update({f"limits.{name}": f"{name}=" for name in given})
        # the amounts go as decimal text (the route takes it): 0.1 stays 0.1, no float rounding
        quota = api.set_quota(tenant, api.pool_id(pool), dict(given))
        warn(quota)
        emit(quota, output, lambda wide: views.quota_view(quota, wide))
