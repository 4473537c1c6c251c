"""Usage accounting route: ``GET /v1/usage`` (docs/operating.md, "Usage accounting"; docs/api.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from app.answers.usage import UsageReport
from app.answers.usage_groups import UsageGroup
from app.api.deps import Principal, Services, current_principal, services
from app.api.errors import responses
from app.api.inventory import IsoTime
from app.capacity.reservations import usage
from app.iam.authorize import authorize

router = APIRouter(tags=["usage"])


@router.get(
    "/v1/usage",
    response_model=UsageReport,
    response_model_exclude_unset=True,
    responses=responses(401, 403, 422),
    operation_id="getUsage",
)
async def get_usage(
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
    principal: Principal = Depends(current_principal),
    svc: Services = Depends(services),
) -> UsageReport:
    """The GPU-hours (atom-hours per device class) and scalar-hours (cpu core-hours, memory MiB-hours, ...)
    held over ``[from, to)``, regular and spot apart, grouped by ``groupBy``: the stored windows of
    bookings and holdings (cut by releases and preemptions), each counted within the period; planned
    windows are not usage. Who may read it is the rule of ``GET /v1/reservations``: a tenant key reads
    its own tenant's (another ``tenantId`` is 403), a key without a tenant needs
    ``compute:reservations:read`` on ``tenant:<id>`` for one tenant or on ``*`` for all."""
    tenant = tenantId or principal.tenant_id
    authorize(principal, "compute:reservations:read", f"tenant:{tenant}" if tenant else "*")
    asked = usage.UsageQuery(start, end, groupBy, tenant, poolId)
    return await usage.usage_report(svc.engine, asked)
