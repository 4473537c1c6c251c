"""Placement routes (seed 004): ``POST /v1/placement/explain``.

Thin: parse the body, authorize ``compute:placement:explain`` on ``*``, call the pure explain, return
``vq.placement-explanation/1``. Malformed documents raise :class:`app.errors.InvalidInput` (422) whose
``details.path`` names the field, e.g. ``fleet.targets.3.node.cpus``. Nothing is stored or contacted.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from app.api.deps import Principal, current_principal
from app.errors import InvalidInput
from app.fleet.explain import DEFAULT_MAX_AGE_SECONDS, explain_documents
from app.iam.authorize import authorize

router = APIRouter(tags=["placement"])

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "UNAUTHENTICATED: no or unknown API key"},
    403: {"description": "FORBIDDEN: the key lacks compute:placement:explain"},
    422: {"description": "INVALID_INPUT: a malformed document; details.path names the field"},
}


class ExplainBody(BaseModel):
    """``{fleet, request, now?, maxAge?, estimate?}``: the two documents, the evaluation time (ISO 8601
    with offset; default the server's clock), the max observation age in seconds (default 300) and an
    optional ``vq.calibrated-estimate/1``."""

    model_config = ConfigDict(extra="forbid")

    fleet: dict[str, Any] = Field(description="vq.placement-fleet/1")
    request: dict[str, Any] = Field(description="vq.placement-request/1")
    now: str | None = Field(default=None, description="ISO 8601 time with a UTC offset")
    maxAge: int = Field(default=DEFAULT_MAX_AGE_SECONDS, ge=0, description="seconds")
    estimate: dict[str, Any] | None = Field(default=None, description="vq.calibrated-estimate/1")


def _parse_now(value: str | None) -> datetime:
    if value is None:
        return datetime.now(UTC)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInput(f"now: {value!r} is not an ISO 8601 time", path="now") from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise InvalidInput(f"now: {value!r} must carry a UTC offset, e.g. +00:00", path="now")
    return parsed


@router.post(
    "/v1/placement/explain",
    operation_id="placement_explain",
    summary="Explain a completion-time placement (vq.placement-explanation/1)",
    responses=ERROR_RESPONSES,
)
async def explain_placement_route(
    body: ExplainBody, principal: Principal = Depends(current_principal)
) -> dict[str, Any]:
    """Every rejected target with its reasons and every eligible one ranked by predicted completion;
    ``held`` when none is eligible. Read-only."""
    authorize(principal, "compute:placement:explain", "*")
    now = _parse_now(body.now)
    # Pure but CPU-bound (about N targets x a few µs): off the event loop for large fleets.
    return await run_in_threadpool(
        explain_documents, body.fleet, body.request, now, body.maxAge, body.estimate
    )
