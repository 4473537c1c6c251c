"""IAM answers."""

from __future__ import annotations

from pydantic import Field

from app.answers.common import NEXT_CURSOR, ApiModel, Timestamp


class ApiKey(ApiModel):
    """A new API key: ``key`` is shown once (it is stored hashed); ``expiresAt`` null: it never expires."""

    id: str
    key: str
    principal: str
    tenantId: str | None
    expiresAt: Timestamp | None = None


class KeyGrant(ApiModel):
    """One grant a key's principal holds: ``action`` on ``resource``."""

    action: str
    resource: str


class ApiKeyInfo(ApiModel):
    """A key as listed: never its secret. ``principal`` is the name it was created with; ``grants`` what
    it may do; ``expiresAt``, ``revokedAt`` and ``lastUsedAt`` are null when it never expires, is not
    revoked, was never used."""

    id: str
    principal: str
    tenantId: str | None
    grants: list[KeyGrant]
    createdAt: Timestamp
    expiresAt: Timestamp | None
    revokedAt: Timestamp | None
    lastUsedAt: Timestamp | None = Field(
        description="The last use, written at most once a minute per key: up to 60 s behind."
    )


class ApiKeyList(ApiModel):
    """A page of keys, newest first."""

    items: list[ApiKeyInfo]
    nextCursor: str | None = NEXT_CURSOR
