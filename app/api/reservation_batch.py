"""``POST /v1/reservations/batch``: bulk create (docs/api.md; :mod:`app.capacity.reservations.bulk`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.answers.reservations import (
    ItemError,
    ReservationBatch,
    ReservationBatchItem,
    ReservationBatchRequest,
)
from app.api.deps import CurrentPrincipal, Principal, ServicesDep
from app.api.errors import json_path, plain_message, responses
from app.api.routing import ExcludeUnsetRoute
from app.api.text_guard import unstorable_item
from app.capacity.reservations import bulk
from app.errors import AppError, InvalidInput
from app.iam.authorize import authorize
from app.placement.request import ReservationRequest

router = APIRouter(tags=["reservations"], route_class=ExcludeUnsetRoute)


def _invalid(index: int, item: Any, exc: ValidationError) -> InvalidInput:
    """The item's first validation error as INVALID_INPUT, its path from the body (``items.3.duration``)."""
    errors = []
    for e in exc.errors():
        loc = ("body", "items", index, *e.get("loc", ()))
        path = json_path(loc, _body_of(index, item), e.get("type", ""))
        entry = {"path": path, "message": plain_message(e.get("msg", "")), "type": e.get("type", "")}
        if entry not in errors:
            errors.append(entry)
    first = errors[0] if errors else {"path": f"items.{index}", "message": "invalid input"}
    return InvalidInput(f"{first['path']}: {first['message']}", first["path"], {"errors": errors})


def _body_of(index: int, item: Any) -> dict[str, Any]:
    """A stand-in body in which ``items.<index>`` is ``item`` (for :func:`json_path`)."""
    return {"items": [None] * index + [item]}


def _checked(principal: Principal, index: int, item: Any) -> ReservationRequest | bulk.ItemResult:
    """The item as a ReservationRequest the principal may create, or its error answer."""
    bad_text = unstorable_item(index, item)
    if bad_text is not None:
        return bulk.failed(bad_text)
    try:
        body = ReservationRequest.model_validate(item)
        authorize(principal, "compute:reservations:create", f"tenant:{body.tenantId}", f"pool:{body.poolId}")
    except ValidationError as exc:
        return bulk.failed(_invalid(index, item, exc))
    except AppError as exc:
        return bulk.failed(exc)
    return body


def _answer(result: bulk.ItemResult) -> ReservationBatchItem:
    if result.error is not None:
        error = ItemError.model_validate(result.error.to_body()["error"])
        return ReservationBatchItem(status=result.status, error=error)
    return ReservationBatchItem(status=result.status, reservation=result.reservation)


@router.post("/v1/reservations/batch", responses=responses(401, 422), operation_id="createReservationBatch")
async def create_reservation_batch(
    body: ReservationBatchRequest, principal: CurrentPrincipal, svc: ServicesDep
) -> ReservationBatch:
    """Create 1 to 256 reservations in one call. Each item is independent (own idempotencyKey,
    authorization, quota): the answer lists ``{status, reservation | error}`` per item, in order, and
    an item's error changes nothing for it nor for the others."""
    items = [_checked(principal, i, item) for i, item in enumerate(body.items)]
    results = await bulk.create_batch(svc.engine, svc.cache, svc.capacity, items)
    return ReservationBatch(items=[_answer(r) for r in results])


@router.api_route(
    "/v1/reservations/batch", methods=["GET", "PUT", "PATCH", "DELETE"], include_in_schema=False
)
async def reservation_batch_other_methods() -> None:
    """405 ``METHOD_NOT_ALLOWED`` with ``Allow: POST``: ``batch`` is not a reservation id, so without
    this route ``GET /v1/reservations/batch`` reached ``GET /v1/reservations/{id}`` and answered 404."""
    raise StarletteHTTPException(405, "Method Not Allowed", headers={"Allow": "POST"})
