"""Request dependencies: the engine and caches from app state, and the calling principal."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.config import CapacityConfig
from app.capacity.planning.snapshot import PoolCache
from app.errors import Unauthenticated
from app.iam.authorize import Principal
from app.iam.key_cache import PrincipalCache
from app.settings import Settings

bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer bck_...`")

__all__ = ["CurrentPrincipal", "Principal", "Services", "ServicesDep", "current_principal", "services"]


@dataclass(frozen=True, slots=True)
class Services:
    """What routes need: the engine, the pool cache, capacity options, settings, and the principals of
    keys that authenticated a moment ago (the request guard's, app/iam/key_cache.py)."""

    engine: AsyncEngine
    cache: PoolCache
    capacity: CapacityConfig
    settings: Settings
    keys: PrincipalCache = field(default_factory=lambda: PrincipalCache(0))


async def services(request: Request) -> Services:
    """The process's :class:`Services` (built in the app's lifespan)."""
    return request.app.state.services


async def current_principal(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)
) -> Principal:
    """The principal of the presented API key, resolved once by the request guard before the body was
    read (app/api/guard.py); ``credentials`` only declares the bearer scheme in the OpenAPI document.
    401 UNAUTHENTICATED when the guard resolved no key (it answers missing or unknown keys itself)."""
    principal = request.scope.get("state", {}).get("principal")
    if not isinstance(principal, Principal):
        raise Unauthenticated("an API key is required: Authorization: Bearer <key>")
    return principal


# A route's parameters ``principal: CurrentPrincipal, svc: ServicesDep``: the two dependencies every
# /v1/ route takes, declared once (FastAPI's ``Annotated`` dependencies)
CurrentPrincipal = Annotated[Principal, Depends(current_principal)]
ServicesDep = Annotated[Services, Depends(services)]
