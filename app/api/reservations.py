"""Reservation and preview routes (seed 000; DESIGN.md, "HTTP API")."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Response

from app.api.deps import Principal, Services, current_principal, services
from app.api.errors import responses
from app.capacity import reservations as svc_reservations
from app.db.tx import read_only
from app.errors import NotFound
from app.iam.authorize import authorize
from app.placement.request import ReservationRequest

router = APIRouter(tags=["reservations"])


@router.post(
    "/v1/capacity/preview",
    responses=responses(401, 403, 404, 422),
    operation_id="previewCapacity",
    tags=["capacity"],
)
async def preview(
    body: ReservationRequest,
    principal: Principal = Depends(current_principal),
    svc: Services = Depends(services),
) -> dict[str, Any]:
    """The placement pipeline without the commit: ``{fits, candidates, reason?}``."""
    authorize(principal, "compute:capacity:read", f"pool:{body.poolId}")
    return await svc_reservations.preview(svc.engine, svc.cache, svc.capacity, body)


@router.post(
    "/v1/reservations",
    status_code=201,
    responses=responses(401, 403, 404, 409, 422),
    operation_id="createReservation",
)
async def create_reservation(
    body: ReservationRequest,
    response: Response,
    principal: Principal = Depends(current_principal),
    svc: Services = Depends(services),
) -> dict[str, Any]:
    """Reserve now: ``placed`` with allocations, or ``pending`` with an Unschedulable condition.
    A retry with the same ``idempotencyKey`` and body answers the same reservation (200)."""
    authorize(principal, "compute:reservations:create", f"tenant:{body.tenantId}", f"pool:{body.poolId}")
    view, created = await svc_reservations.create_reservation(svc.engine, svc.cache, svc.capacity, body)
    if not created:
        response.status_code = 200
    return view


async def _authorized_tenant(svc: Services, principal: Principal, reservation_id: str, action: str) -> str:
    owner = await read_only(svc.engine, svc_reservations.reservation_tenant, reservation_id)
    if owner is None or (principal.tenant_id is not None and owner[0] != principal.tenant_id):
        raise NotFound(f"reservation {reservation_id} not found")
    authorize(principal, action, f"tenant:{owner[0]}")
    return owner[0]


@router.get(
    "/v1/reservations/{reservation_id}", responses=responses(401, 403, 404), operation_id="getReservation"
)
async def get_reservation(
    reservation_id: str, principal: Principal = Depends(current_principal), svc: Services = Depends(services)
) -> dict[str, Any]:
    tenant = await _authorized_tenant(svc, principal, reservation_id, "compute:reservations:read")
    return await read_only(svc.engine, svc_reservations.get_reservation, reservation_id, tenant)


@router.get("/v1/reservations", responses=responses(401, 403, 422), operation_id="listReservations")
async def list_reservations(
    tenantId: str | None = Query(default=None, max_length=128),
    status: Literal["placed", "pending", "queued", "released", "preempted", "ended"] | None = Query(
        default=None
    ),
    limit: int = Query(default=100, ge=1, le=1000),
    principal: Principal = Depends(current_principal),
    svc: Services = Depends(services),
) -> dict[str, list[dict[str, Any]]]:
    tenant = tenantId or principal.tenant_id
    authorize(principal, "compute:reservations:read", f"tenant:{tenant}" if tenant else "*")
    items = await read_only(svc.engine, svc_reservations.list_reservations, tenant, status, limit)
    return {"items": items}


@router.post(
    "/v1/reservations/{reservation_id}/release",
    responses=responses(401, 403, 404),
    operation_id="releaseReservation",
)
async def release_reservation(
    reservation_id: str, principal: Principal = Depends(current_principal), svc: Services = Depends(services)
) -> dict[str, Any]:
    tenant = await _authorized_tenant(svc, principal, reservation_id, "compute:reservations:release")
    return await svc_reservations.release_reservation(svc.engine, reservation_id, tenant)
