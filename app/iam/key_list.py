"""List API keys: who may see which, and a page of them (docs/operating.md, "Keys"; docs/api.md, "IAM").

Listing keys is administering them: an admin key (untenanted, ``compute:iam:admin`` on ``*``) sees every
key; a tenant key holding ``compute:iam:admin`` on ``tenant:<its tenant>`` sees its tenant's keys; an
untenanted key holding it on some tenants (``tenant:<id>``, ``tenant:*``) sees those tenants' keys. Any
other key is refused (403). A listed key never shows its secret (only its hash is stored).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.answers.iam import ApiKeyInfo, KeyGrant
from app.db.tables import api_keys, grants, principals
from app.db.tx import reads
from app.iam.authorize import Principal, granted_tenants, is_admin, refusal

IAM_ADMIN = "compute:iam:admin"


@dataclass(frozen=True, slots=True)
class KeyPage:
    """A page of keys, newest first, and ``next``: the last item's ``(createdAt, id)`` when more remain."""

    items: list[ApiKeyInfo]
    next: tuple[str, str] | None


@dataclass(frozen=True, slots=True)
class Visible:
    """The keys a caller may list: every key (``everything``), else those of ``tenants`` (None: of
    every tenant, never an untenanted key)."""

    everything: bool
    tenants: frozenset[str] | None = None


def visible_keys(principal: Principal) -> Visible:
    """Which keys ``principal`` may list (the module docstring); raises
    :class:`~app.errors.Forbidden` for a key that may list none."""
    if is_admin(principal):
        return Visible(everything=True)
    tenants = granted_tenants(principal, IAM_ADMIN)
    if principal.tenant_id is not None:
        if tenants is not None and principal.tenant_id not in tenants:
            raise refusal(principal, IAM_ADMIN, f"tenant:{principal.tenant_id}")
        return Visible(everything=False, tenants=frozenset({principal.tenant_id}))
    if tenants is not None and not tenants:
        raise refusal(principal, IAM_ADMIN, "tenant:*")
    return Visible(everything=False, tenants=tenants)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


@reads
async def list_api_keys(
    conn: AsyncConnection, visible: Visible, limit: int = 100, after: tuple[datetime, str] | None = None
) -> KeyPage:
    """A page of the keys ``visible`` allows, newest first (``created_at`` then id, descending), after
    the key ``(createdAt, id)`` of the previous page's last item; revoked and expired keys included. Two
    statements: the keys with their principals, then the grants of those principals."""
    # SELECT k.*, p.name, p.tenant_id FROM api_keys k JOIN principals p ON p.id = k.principal_id
    #  [WHERE p.tenant_id IN (:tenants) | p.tenant_id IS NOT NULL] [AND (k.created_at, k.id) < (:c, :id)]
    #  ORDER BY k.created_at DESC, k.id DESC LIMIT :limit + 1
    stmt = (
        sa.select(api_keys, principals.c.name, principals.c.tenant_id)
        .select_from(api_keys.join(principals, principals.c.id == api_keys.c.principal_id))
        .order_by(api_keys.c.created_at.desc(), api_keys.c.id.desc())
        .limit(limit + 1)
    )
    if not visible.everything:
        if visible.tenants is None:
            stmt = stmt.where(principals.c.tenant_id.is_not(None))
        else:
            stmt = stmt.where(principals.c.tenant_id.in_(sorted(visible.tenants)))
    if after is not None:
        stmt = stmt.where(sa.tuple_(api_keys.c.created_at, api_keys.c.id) < sa.tuple_(*after))
    rows = (await conn.execute(stmt)).all()
    page, more = rows[:limit], len(rows) > limit
    held: dict[str, list[KeyGrant]] = {}
    if page:
        # SELECT principal_id, action, resource FROM grants WHERE principal_id IN (:ids)
        found = await conn.execute(
            sa.select(grants)
            .where(grants.c.principal_id.in_({r.principal_id for r in page}))
            .order_by(grants.c.principal_id, grants.c.action, grants.c.resource)
        )
        for g in found:
            held.setdefault(g.principal_id, []).append(KeyGrant(action=g.action, resource=g.resource))
    items = [
        ApiKeyInfo(
            id=r.id,
            principal=r.name,
            tenantId=r.tenant_id,
            grants=held.get(r.principal_id, []),
            createdAt=r.created_at.isoformat(),
            expiresAt=_iso(r.expires_at),
            revokedAt=_iso(r.revoked_at),
            lastUsedAt=_iso(r.last_used_at),
        )
        for r in page
    ]
    return KeyPage(items, (items[-1].createdAt, items[-1].id) if more else None)
