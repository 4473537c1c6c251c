"""Health and metrics (no key needed)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.api.deps import Services, services
from app.api.errors import responses
from app.api.models.health import Health, Readiness
from app.db.engine import ping
from app.errors import AppError
from app.observability.metrics import exposition

router = APIRouter(tags=["health"])


class NotReady(AppError):
    code = "NOT_READY"
    status = 503


@router.get("/healthz", response_model=Health, operation_id="checkHealth")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {**responses(503)[503], "description": "NOT_READY: the database does not answer"}},
    operation_id="checkReadiness",
)
async def readyz(svc: Services = Depends(services)) -> dict[str, str]:
    """The database answers."""
    try:
        await ping(svc.engine)
    except Exception as exc:  # any failure to reach the database means not ready
        raise NotReady(f"database unavailable: {type(exc).__name__}") from exc
    return {"status": "ready"}


@router.get(
    "/metrics",
    operation_id="getMetrics",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text"}
    },
)
async def metrics(svc: Services = Depends(services)) -> Response:
    """Prometheus metrics (docs/metrics.md)."""
    body = await exposition(svc.engine, svc.settings.metrics_gauge_ttl_seconds)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
