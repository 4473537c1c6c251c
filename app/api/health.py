"""Health and metrics (no key needed; ``/metrics`` asks for one when ``BC_METRICS_REQUIRE_KEY`` is on)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.answers.health import Health, Readiness
from app.api.deps import ServicesDep, current_principal
from app.api.errors import responses
from app.db.engine import ping
from app.errors import AppError
from app.iam.authorize import authorize
from app.observability.metrics import exposition

router = APIRouter(tags=["health"])
METRICS_ACTION = "compute:capacity:read"  # with BC_METRICS_REQUIRE_KEY: held on "*"


class NotReady(AppError):
    code = "NOT_READY"
    status = 503


@router.get("/healthz", operation_id="checkHealth")
async def healthz() -> Health:
    """The process is up."""
    return Health(status="ok")


@router.get(
    "/readyz",
    responses={503: {**responses(503)[503], "description": "NOT_READY: the database does not answer"}},
    operation_id="checkReadiness",
)
async def readyz(svc: ServicesDep) -> Readiness:
    """The database answers."""
    try:
        await ping(svc.engine)
    except Exception as exc:  # any failure to reach the database means not ready
        raise NotReady(f"database unavailable: {type(exc).__name__}") from exc
    return Readiness(status="ready")


@router.get(
    "/metrics",
    operation_id="getMetrics",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text"},
        **responses(401, 403),
    },
)
async def metrics(request: Request, svc: ServicesDep) -> Response:
    """Prometheus metrics (docs/metrics.md). Open by default; with `BC_METRICS_REQUIRE_KEY` on, an API
    key holding `compute:capacity:read` on `*` (the labels name every pool): 401 without a key, 403
    with another."""
    if svc.settings.metrics_require_key:
        authorize(await current_principal(request), METRICS_ACTION, "*")
    body = await exposition(svc.engine, svc.settings.metrics_gauge_ttl_seconds)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
