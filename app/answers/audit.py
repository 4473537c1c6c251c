"""Audit log answers (docs/operating.md, "Audit log")."""

from __future__ import annotations

from pydantic import Field

from app.answers.common import NEXT_CURSOR, ApiModel, Timestamp


class AuditActor(ApiModel):
    """Who made the request: the API key id (``bootstrap`` for the bootstrap admin key; null when no
    key authenticated), the key's principal, its role and the key's tenant (null: untenanted)."""

    keyId: str | None
    principal: str | None
    role: str = Field(
        description="admin, tenant (a tenant-scoped key), agent, key (another key) or anonymous"
    )
    tenantId: str | None


class AuditEvent(ApiModel):
    """One mutating request: who, what (operation id, method, route template, the path parameters and,
    for a create, the new resource's id), when (the database clock) and the answer's HTTP status."""

    id: str
    at: Timestamp
    requestId: str | None = Field(description="The request's X-Request-Id (as in the access log)")
    actor: AuditActor
    operationId: str
    method: str
    route: str = Field(description="The route template, e.g. /v1/nodes/{node_id}/cordon")
    pathParams: dict[str, str]
    createdId: str | None = Field(description="The created resource's id (a 201 answer), else null")
    resources: list[str] = Field(description="The path parameters' values, then createdId")
    status: int = Field(description="The HTTP status of the answer")


class AuditEventList(ApiModel):
    """A page of audit events, newest first."""

    items: list[AuditEvent]
    nextCursor: str | None = NEXT_CURSOR
