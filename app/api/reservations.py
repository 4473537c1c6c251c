"""Reservation and preview routes (docs/placement-rules.md; docs/api.md, "HTTP API")."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.answers.reservations import Preview, Reservation, ReservationList, ReservationStatus
from app.api.access import RESERVATIONS_READ, authorize_tenant_read
from app.api.deps import CurrentPrincipal, ServicesDep
from app.api.errors import responses, unsatisfiable
from app.api.paging import PageCursor, PageLimit, created_after, next_cursor
from app.api.routing import ExcludeUnsetRoute
from app.capacity.queue import worker as svc_queue
from app.capacity.reservations import extend as svc_extend
from app.capacity.reservations import preview as svc_preview
from app.capacity.reservations import reads as svc_reads
from app.capacity.reservations import release as svc_release
from app.capacity.reservations.access import authorized_reservation_tenant
from app.iam.authorize import authorize, may_read_work_of
from app.placement.request import (
    FIRST_WINDOW_YEAR,
    LAST_WINDOW_YEAR,
    CreateReservationRequest,
    ReservationRequest,
    window_end,
)

router = APIRouter(tags=["reservations"], route_class=ExcludeUnsetRoute)


@router.post(
    "/v1/capacity/preview",
    responses=responses(401, 403, 404, 422),
    operation_id="previewCapacity",
    tags=["capacity"],
)
async def preview(body: ReservationRequest, principal: CurrentPrincipal, svc: ServicesDep) -> Preview:
    """The placement pipeline without the commit: ``{fits, candidates, reason?}``."""
    authorize(principal, "compute:capacity:read", f"pool:{body.poolId}", tenant=body.tenantId)
    return await svc_preview.preview(svc.engine, svc.cache, svc.capacity, body)


@router.post(
    "/v1/reservations",
    status_code=201,
    responses={
        200: {"model": Reservation, "description": "An idempotent retry: the reservation made before"},
        202: {
            "model": Reservation,
            "description": "Queued (BC_CAPACITY_PLACER=pool-lease): a batch worker decides it; "
            "GET /v1/reservations/{id}?waitSeconds=N waits for the decision",
        },
        **responses(401, 403, 404, 412, 422, conflicts=("QUOTA_EXCEEDED", "IDEMPOTENCY_KEY_REUSED")),
        **unsatisfiable(),
    },
    operation_id="createReservation",
)
async def create_reservation(
    body: CreateReservationRequest, response: Response, principal: CurrentPrincipal, svc: ServicesDep
) -> Reservation:
    """Reserve now: ``placed`` with allocations, or ``pending`` with an Unschedulable condition; with
    the pool-lease placer ``queued`` (202) until a batch worker decides it. A request the pool could
    never hold is 422 (INVALID_INPUT or UNSATISFIABLE; docs/api.md, "Checked at intake"). A retry
    with the same ``idempotencyKey`` and body answers the same reservation (200). With ``ifPlan`` (a
    preview's ``planToken``) it commits exactly that plan, or answers 412 PLAN_STALE naming what
    changed (docs/api.md, "Plan tokens")."""
    authorize(principal, "compute:reservations:create", f"tenant:{body.tenantId}", f"pool:{body.poolId}")
    view, created = await svc_queue.create(svc.engine, svc.cache, svc.capacity, body, body.ifPlan)
    if not created:
        response.status_code = 200
    elif view.status == ReservationStatus.queued:
        response.status_code = 202
    return view


@router.get(
    "/v1/reservations/{reservation_id}",
    responses=responses(401, 403, 404, 422),
    operation_id="getReservation",
)
async def get_reservation(
    reservation_id: str,
    request: Request,
    principal: CurrentPrincipal,
    svc: ServicesDep,
    waitSeconds: int = Query(
        default=0,
        ge=0,
        le=svc_queue.MAX_WAIT_SECONDS,
        description="Wait up to this many seconds (0..30) while the reservation is queued",
    ),
) -> Reservation:
    """The reservation; with ``waitSeconds`` a queued one is answered once a batch worker decided it
    (or when the wait is over, still queued)."""
    if waitSeconds > 0:  # the long-poll authorizes on the row it reads: one read, not two
        worker: svc_queue.QueueWorker = request.app.state.queue
        return await worker.wait(svc.engine, principal, reservation_id, waitSeconds)
    tenant = await authorized_reservation_tenant(svc.engine, principal, reservation_id, RESERVATIONS_READ)
    return await svc_reads.get_reservation(svc.engine, reservation_id, tenant)


@router.get("/v1/reservations", responses=responses(401, 403, 422), operation_id="listReservations")
async def list_reservations(
    principal: CurrentPrincipal,
    svc: ServicesDep,
    tenantId: str | None = Query(default=None, max_length=128),
    status: ReservationStatus | None = Query(default=None),
    poolId: str | None = Query(default=None, max_length=128, description="only the pool's reservations"),
    nodeId: str | None = Query(
        default=None,
        max_length=128,
        description="only reservations with an allocation on the node, now or before (a planned window too)",
    ),
    limit: PageLimit = 100,
    cursor: PageCursor = None,
) -> ReservationList:
    """A page of reservations, newest first; pass ``nextCursor`` as ``cursor`` for the next page. The
    filters combine (AND); a pool or node that does not exist gives an empty page, as an unknown tenant
    does. A tenant key lists its own tenant's only."""
    where = svc_reads.ListFilter(authorize_tenant_read(principal, tenantId), status, poolId, nodeId)
    page = await svc_reads.list_reservations(svc.engine, where, limit, created_after(cursor, "reservations"))
    return ReservationList(items=page.items, nextCursor=next_cursor("reservations", page.next))


@router.post(
    "/v1/reservations/{reservation_id}/release",
    responses=responses(401, 403, 404),
    operation_id="releaseReservation",
)
async def release_reservation(
    reservation_id: str, principal: CurrentPrincipal, svc: ServicesDep
) -> Reservation:
    tenant = await authorized_reservation_tenant(
        svc.engine, principal, reservation_id, "compute:reservations:release"
    )
    return await svc_release.release_reservation(svc.engine, reservation_id, tenant)


class ExtendBody(BaseModel):
    """``{end: "2026-12-02T12:00:00Z"}``: the new end of a placed reservation (docs/lifecycle.md,
    "Extend")."""

    model_config = ConfigDict(extra="forbid")
    end: datetime = Field(
        description="ISO 8601 with a UTC offset, in years 1970..9999: at or after the current end (the same "
        "end again is a no-op), at most BC_CAPACITY_MAX_LEAD ahead of now"
    )

    @field_validator("end")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("end needs a timezone, e.g. 2026-12-01T12:00:00Z")
        if window_end(value, 0) is None:
            raise ValueError(f"end must lie in years {FIRST_WINDOW_YEAR}..{LAST_WINDOW_YEAR} (UTC)")
        return value


@router.post(
    "/v1/reservations/{reservation_id}/extend",
    responses=responses(401, 403, 404, 422, conflicts=("CONFLICT", "QUOTA_EXCEEDED")),
    operation_id="extendReservation",
)
async def extend_reservation(
    reservation_id: str, body: ExtendBody, principal: CurrentPrincipal, svc: ServicesDep
) -> Reservation:
    """Lengthen a placed reservation to ``end`` on the same atoms and amounts (docs/lifecycle.md,
    "Extend"): 409 CONFLICT naming the reservation booked in the way (by id where this key may read its
    tenant's work, else "another reservation"), or when the reservation is not placed; 409
    QUOTA_EXCEEDED; 422 at ``end`` for an end before the current one. Nothing changes on a refusal; the
    same end again answers the reservation unchanged."""
    tenant = await authorized_reservation_tenant(
        svc.engine, principal, reservation_id, "compute:reservations:release"
    )
    return await svc_extend.extend_reservation(
        svc.engine,
        reservation_id,
        tenant,
        body.end,
        lambda owner: may_read_work_of(principal, owner),
        svc.capacity.max_lead,
    )
