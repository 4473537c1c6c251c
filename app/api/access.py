"""Authorization rules that several routes share, written once: a node's routes authorize on the node's
pool, and the reads of a tenant's work (reservations, usage) authorize on the tenant they read. Each
route still calls one of these (or :func:`app.iam.authorize.authorize`) itself, after its body and
parameters were validated."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from app.iam.authorize import Principal, authorize
from app.inventory import service as inventory

RESERVATIONS_READ = "compute:reservations:read"


async def authorize_on_node(principal: Principal, action: str, engine: AsyncEngine, node_id: str) -> None:
    """Authorize ``action`` on ``pool:<the node's pool>``; 404 NOT_FOUND for a node that does not exist
    (before the grant is checked, as every node route answers)."""
    authorize(principal, action, f"pool:{await inventory.node_pool_id(engine, node_id)}")


def authorize_tenant_read(principal: Principal, tenant_id: str | None) -> str | None:
    """The tenant whose work a list reads, authorized: ``tenant_id``, or when absent the key's own tenant
    (``None``: every tenant). Needs ``compute:reservations:read`` on ``tenant:<id>``, or on ``*`` for every
    tenant; a tenant key asking for another tenant is 403 (docs/api.md)."""
    tenant = tenant_id or principal.tenant_id
    authorize(principal, RESERVATIONS_READ, f"tenant:{tenant}" if tenant else "*")
    return tenant
