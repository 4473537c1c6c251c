"""Request dependencies: the engine and caches from app state, and the calling principal."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.reservations import CapacityConfig
from app.capacity.snapshot import PoolCache
from app.errors import Unauthenticated
from app.iam.authorize import Principal
from app.iam.service import principal_for_key
from app.settings import Settings

bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer bck_...`")

__all__ = ["Principal", "Services", "current_principal", "services"]


@dataclass(frozen=True, slots=True)
class Services:
    """What routes need: the engine, the pool cache, capacity options and settings."""

    engine: AsyncEngine
    cache: PoolCache
    capacity: CapacityConfig
    settings: Settings


async def services(request: Request) -> Services:
    """The process's :class:`Services` (built in the app's lifespan)."""
    return request.app.state.services


async def current_principal(
    credentials: HTTPAuthorizationCredentials | None = Depends(bearer),
    svc: Services = Depends(services),
) -> Principal:
    """The principal of the presented API key; 401 UNAUTHENTICATED when missing, unknown or revoked."""
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise Unauthenticated("an API key is required: Authorization: Bearer <key>")
    async with svc.engine.connect() as conn:
        # one SELECT: autocommit spares the BEGIN and ROLLBACK round trips on every request
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        return await principal_for_key(conn, credentials.credentials, svc.settings.bootstrap_admin_key)
