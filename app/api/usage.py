"""Usage accounting route: ``GET /v1/usage`` (docs/operating.md, "Usage accounting"; docs/api.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.answers.usage import UsageReport
from app.answers.usage_groups import UsageGroup
from app.api.access import authorize_tenant_read
from app.api.deps import CurrentPrincipal, ServicesDep
from app.api.errors import responses
from app.api.routing import ExcludeUnsetRoute
from app.api.times import IsoTime
from app.capacity.reservations import usage

router = APIRouter(tags=["usage"], route_class=ExcludeUnsetRoute)


@router.get("/v1/usage", responses=responses(401, 403, 422), operation_id="getUsage")
async def get_usage(
    principal: CurrentPrincipal,
    svc: ServicesDep,
    start: Annotated[
        IsoTime,
        Query(alias="from", description="ISO 8601 with a UTC offset; absent: 30 days before `to`"),
    ] = None,
    end: Annotated[
        IsoTime,
        Query(
            alias="to",
            description="ISO 8601 with a UTC offset, exclusive, after `from` and at most 366 days after "
            "it; absent: the database's now",
        ),
    ] = None,
    poolId: str | None = Query(default=None, max_length=128, description="only this pool's usage"),
    tenantId: str | None = Query(
        default=None,
        max_length=128,
        description="only this tenant's usage (a tenant key: its own, the default)",
    ),
    groupBy: UsageGroup = Query(
        default=UsageGroup.tenant, description="one row per tenant, pool, node or resource"
    ),
) -> UsageReport:
    """The GPU-hours (atom-hours per device class) and scalar-hours (cpu core-hours, memory MiB-hours, ...)
    held over ``[from, to)``, regular and spot apart, grouped by ``groupBy``: the stored windows of
    bookings and holdings (cut by releases and preemptions), each counted within the period; planned
    windows are not usage. Who may read it is the rule of ``GET /v1/reservations``: a tenant key reads
    its own tenant's (another ``tenantId`` is 403), a key without a tenant needs
    ``compute:reservations:read`` on ``tenant:<id>`` for one tenant or on ``*`` for all."""
    asked = usage.UsageQuery(start, end, groupBy, authorize_tenant_read(principal, tenantId), poolId)
    return await usage.usage_report(svc.engine, asked)
