"""The audit log route: ``GET /v1/audit``, for admins (docs/operating.md, "Audit log")."""

from __future__ import annotations

from fastapi import APIRouter, Query
from pydantic import AwareDatetime

from app.answers.audit import AuditEventList
from app.api.deps import CurrentPrincipal, ServicesDep
from app.api.errors import responses
from app.api.paging import PageCursor, PageLimit, created_after, next_cursor
from app.iam import audit_log
from app.iam.authorize import is_admin, refusal

router = APIRouter(tags=["audit"])

AUDIT_ACTION = "compute:iam:admin"  # on *, by an untenanted key: an admin (app/iam/authorize.py, is_admin)


@router.get("/v1/audit", responses=responses(401, 403, 422), operation_id="listAuditEvents")
async def list_audit_events(
    principal: CurrentPrincipal,
    svc: ServicesDep,
    since: AwareDatetime | None = Query(
        default=None, alias="from", description="Only events at or after this time (ISO 8601 with offset)"
    ),
    until: AwareDatetime | None = Query(
        default=None, alias="to", description="Only events before this time (ISO 8601 with offset)"
    ),
    actor: str | None = Query(
        default=None, min_length=1, max_length=256, description="Only this API key id or principal name"
    ),
    resource: str | None = Query(
        default=None,
        min_length=1,
        max_length=256,
        description="Only events naming this id: a path parameter or the created resource",
    ),
    limit: PageLimit = 100,
    cursor: PageCursor = None,
) -> AuditEventList:
    """A page of the audit log, newest first: one event per mutating request (who, what, when, the
    answer's status). The filters combine (AND). Admin keys only: 403 for any other key."""
    if not is_admin(principal):  # a tenant key holding * on * is still its tenant's only
        raise refusal(principal, AUDIT_ACTION, "*")
    where = audit_log.AuditFilter(since, until, actor, resource)
    page = await audit_log.list_events(svc.engine, where, limit, created_after(cursor, "audit"))
    return AuditEventList(items=page.items, nextCursor=next_cursor("audit", page.next))
