"""Quota routes: set and read a tenant's limits in a pool."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from app.answers.quota import Quota, QuotaWritten
from app.api.deps import CurrentPrincipal, ServicesDep
from app.api.errors import responses
from app.iam.authorize import authorize
from app.ids import TenantId
from app.jsonnum import JsonDecimal
from app.quota.limits import replace_limits
from app.quota.view import quota_view

router = APIRouter(tags=["quota"])


class QuotaBody(BaseModel):
    """``{limits: {gpu: 16, cpu: 256}}``: resource (device class or scalar) -> limit."""

    model_config = ConfigDict(extra="forbid")
    limits: dict[
        Annotated[str, Field(pattern=r"^[a-z][a-z0-9._/-]*$", max_length=64)],
        Annotated[Decimal, JsonDecimal(ge=0, max_digits=24, decimal_places=6)],
    ]


QUOTA_PATH = "/v1/tenants/{tenant_id}/quotas/{pool_id}"


@router.put(QUOTA_PATH, responses=responses(401, 403, 404, 422), operation_id="setQuota")
async def set_quota(
    tenant_id: TenantId, pool_id: str, body: QuotaBody, principal: CurrentPrincipal, svc: ServicesDep
) -> QuotaWritten:
    """Replace the tenant's limits in the pool (docs/quota.md, "Writing limits"): 422 at
    ``limits.<name>`` for a name no node of the pool has or a fractional device-class limit."""
    authorize(principal, "compute:quota:write", f"pool:{pool_id}", tenant=tenant_id)
    return await replace_limits(svc.engine, tenant_id, pool_id, dict(body.limits))


@router.get(QUOTA_PATH, responses=responses(401, 403, 404), operation_id="getQuota")
async def get_quota(tenant_id: str, pool_id: str, principal: CurrentPrincipal, svc: ServicesDep) -> Quota:
    authorize(principal, "compute:reservations:read", f"tenant:{tenant_id}")
    return await quota_view(svc.engine, tenant_id, pool_id)
