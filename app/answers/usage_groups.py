"""How ``GET /v1/usage`` groups its rows: one home for the API's models and the CLI (kept free of
pydantic, so the CLI starts fast; docs/operating.md, "Usage accounting")."""

from __future__ import annotations

from enum import StrEnum


class UsageGroup(StrEnum):
    """One row per tenant, pool, node or resource name (device class or scalar resource)."""

    tenant = "tenant"
    pool = "pool"
    node = "node"
    resource = "resource"
