"""IAM routes: create, list and revoke API keys (docs/api.md, "IAM"; docs/operating.md, "Keys")."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.answers.iam import ApiKey, ApiKeyList
from app.api.deps import CurrentPrincipal, ServicesDep
from app.api.errors import responses
from app.api.paging import PageCursor, PageLimit, created_after, next_cursor
from app.iam.authorize import Grant
from app.iam.key_list import list_api_keys, visible_keys
from app.iam.service import authorize_key_creation, create_api_key, revoke_api_key
from app.ids import TenantId

router = APIRouter(tags=["iam"])
KEYS_CURSOR = "api-keys"


class GrantBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: str = Field(min_length=1, max_length=128)
    resource: str = Field(min_length=1, max_length=256)


class ApiKeyCreate(BaseModel):
    """``{principal, tenantId?, grants: [{action, resource}], expiresAt?}``."""

    model_config = ConfigDict(extra="forbid")
    principal: str = Field(min_length=1, max_length=128)
    tenantId: TenantId | None = None
    grants: list[GrantBody] = Field(default_factory=list, max_length=256)
    expiresAt: datetime | None = Field(
        default=None,
        description="ISO 8601 with a UTC offset, in the future: the key is refused from then on "
        "(401 `key expired`); absent: it never expires",
    )

    @field_validator("expiresAt", mode="before")
    @classmethod
    def _text(cls, value: object) -> object:
        if value is not None and not isinstance(value, str):  # no Unix times: a time says its offset
            raise ValueError("expiresAt is an ISO 8601 time with its offset, e.g. 2027-01-01T00:00:00Z")
        return value

    @field_validator("expiresAt")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return value
        if value.tzinfo is None:
            raise ValueError("expiresAt needs a timezone, e.g. 2027-01-01T00:00:00Z")
        try:
            return value.astimezone(UTC)
        except OverflowError:
            raise ValueError("expiresAt must lie before year 10000 (UTC)") from None


@router.post("/v1/api-keys", status_code=201, responses=responses(401, 403, 422), operation_id="createApiKey")
async def create_key(body: ApiKeyCreate, principal: CurrentPrincipal, svc: ServicesDep) -> ApiKey:
    key_grants = [Grant(g.action, g.resource) for g in body.grants]
    authorize_key_creation(principal, body.tenantId, key_grants)
    return await create_api_key(svc.engine, body.principal, body.tenantId, key_grants, body.expiresAt)


@router.get("/v1/api-keys", responses=responses(401, 403, 422), operation_id="listApiKeys")
async def list_keys(
    principal: CurrentPrincipal, svc: ServicesDep, limit: PageLimit = 100, cursor: PageCursor = None
) -> ApiKeyList:
    """A page of API keys, newest first, revoked and expired ones included, never a secret: every key
    for an admin key, its own tenant's for a tenant key (``compute:iam:admin`` on the tenant)."""
    visible = visible_keys(principal)
    page = await list_api_keys(svc.engine, visible, limit, created_after(cursor, KEYS_CURSOR))
    return ApiKeyList(items=page.items, nextCursor=next_cursor(KEYS_CURSOR, page.next))


@router.delete(
    "/v1/api-keys/{key_id}", status_code=204, responses=responses(401, 403, 404), operation_id="revokeApiKey"
)
async def revoke_key(key_id: str, principal: CurrentPrincipal, svc: ServicesDep) -> None:
    await revoke_api_key(svc.engine, key_id, principal)
    # refused at once by this process; by the others once their cached principal expires
    # (BC_KEY_CACHE_SECONDS, app/iam/key_cache.py)
    svc.keys.forget_key(key_id)
