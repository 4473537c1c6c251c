"""IAM answers."""

from __future__ import annotations

from app.answers.common import ApiModel


class ApiKey(ApiModel):
    """A new API key: ``key`` is shown once (it is stored hashed)."""

    id: str
    key: str
    principal: str
    tenantId: str | None
