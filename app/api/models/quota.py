"""Quota answers."""

from __future__ import annotations

from app.api.models.common import ApiModel, Number


class Quota(ApiModel):
    """A tenant's quota in a pool: ``limits`` and ``used`` by resource (device class or scalar name);
    a resource without a limit is unlimited."""

    tenantId: str
    poolId: str
    limits: dict[str, Number]
    used: dict[str, Number]
