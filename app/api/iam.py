"""IAM routes: create and revoke API keys."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from app.answers.iam import ApiKey
from app.api.deps import Principal, Services, current_principal, services
from app.api.errors import responses
from app.iam.authorize import Grant
from app.iam.service import authorize_key_creation, create_api_key, revoke_api_key
from app.ids import TenantId

router = APIRouter(tags=["iam"])


class GrantBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: str = Field(min_length=1, max_length=128)
    resource: str = Field(min_length=1, max_length=256)


class ApiKeyCreate(BaseModel):
    """``{principal, tenantId?, grants: [{action, resource}]}``."""

    model_config = ConfigDict(extra="forbid")
    principal: str = Field(min_length=1, max_length=128)
    tenantId: TenantId | None = None
    grants: list[GrantBody] = Field(default_factory=list, max_length=256)


@router.post(
    "/v1/api-keys",
    status_code=201,
    response_model=ApiKey,
    responses=responses(401, 403, 422),
    operation_id="createApiKey",
)
async def create_key(
    body: ApiKeyCreate, principal: Principal = Depends(current_principal), svc: Services = Depends(services)
) -> ApiKey:
    key_grants = [Grant(g.action, g.resource) for g in body.grants]
    authorize_key_creation(principal, body.tenantId, key_grants)
    return await create_api_key(svc.engine, body.principal, body.tenantId, key_grants)


@router.delete(
    "/v1/api-keys/{key_id}", status_code=204, responses=responses(401, 403, 404), operation_id="revokeApiKey"
)
async def revoke_key(
    key_id: str, principal: Principal = Depends(current_principal), svc: Services = Depends(services)
) -> None:
    await revoke_api_key(svc.engine, key_id, principal)
    # refused at once by this process; by the others once their cached principal expires
    # (BC_KEY_CACHE_SECONDS, app/iam/key_cache.py)
    svc.keys.forget_key(key_id)
