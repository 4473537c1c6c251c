"""Placement routes (docs/explain.md): explain, fleet build, compare, and the stored job records.

Thin: parse the body, authorize ``compute:placement:explain`` on ``*``, call the pure explain, return
``vq.placement-explanation/1``. Malformed documents raise :class:`app.errors.InvalidInput` (422) whose
``details.path`` names the field, e.g. ``fleet.targets.3.node.cpus``. Nothing is stored or contacted.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from app.answers.placement import Comparison, Explanation, FleetBuild, JobHistory
from app.api.deps import CurrentPrincipal, ServicesDep
from app.api.errors import responses
from app.api.routing import ExcludeUnsetRoute
from app.db.job_records import job_records, record_job
from app.errors import InvalidInput, quote_input
from app.fleet.documents import parse_instant
from app.fleet.explain import DEFAULT_MAX_AGE_SECONDS, explain_documents
from app.fleet.history import JobRecord, job_history_document, stored_record
from app.iam.authorize import authorize

# every placement route answers the same errors (404: a path parameter names nothing)
router = APIRouter(tags=["placement"], responses=responses(401, 403, 404, 422), route_class=ExcludeUnsetRoute)
MAX_AGE_LIMIT = 10 * 366 * 86400  # ten years, in seconds
EXPLAIN = "compute:placement:explain"


class ExplainBody(BaseModel):
    """``{fleet, request, now?, maxAge?, estimate?}``: the two documents, the evaluation time (ISO 8601
    with offset; default the server's clock), the max observation age in seconds (default 300) and an
    optional ``vq.calibrated-estimate/1``."""

    model_config = ConfigDict(extra="forbid")

    fleet: dict[str, Any] = Field(description="vq.placement-fleet/1")
    request: dict[str, Any] = Field(description="vq.placement-request/1")
    now: str | None = Field(default=None, description="ISO 8601 time with a UTC offset")
    maxAge: int = Field(
        default=DEFAULT_MAX_AGE_SECONDS, ge=0, le=MAX_AGE_LIMIT, strict=True, description="seconds"
    )
    estimate: dict[str, Any] | None = Field(default=None, description="vq.calibrated-estimate/1")


def _parse_now(value: str | None) -> datetime:
    return datetime.now(UTC) if value is None else parse_instant(value)


@router.post(
    "/v1/placement/explain",
    operation_id="explainPlacement",
    response_model=Explanation,
    summary="Explain a completion-time placement (vq.placement-explanation/1)",
)
async def explain_placement_route(body: ExplainBody, principal: CurrentPrincipal) -> dict[str, Any]:
    """Every rejected target with its reasons and every eligible one ranked by predicted completion;
    ``held`` when none is eligible. Read-only."""
    authorize(principal, EXPLAIN, "*")
    now = _parse_now(body.now)
    # Pure but CPU-bound (about N targets x a few µs): off the event loop for large fleets.
    return await run_in_threadpool(
        explain_documents, body.fleet, body.request, now, body.maxAge, body.estimate
    )


class FleetBody(BaseModel):
    """``{base, now?, maxAge?, capacity?, queueHistory?, schedulerShape?, runtimeRoot?}``: the base
    ``vq.placement-fleet/1`` and evidence already collected (docs/explain.md):
    ``capacity`` ``{NAME: vq.broker-capacity/1}``, ``queueHistory`` ``{LANE: {target?, jobs: [job
    record]}}``, ``schedulerShape`` ``{LANE: {sinfo: TEXT} | {qstat: TEXT, pbsnodes: TEXT}}``,
    ``runtimeRoot`` ``{NAME: vq.runtime-generations/1}``. ``now`` dates observations (default the
    server's clock); ``maxAge`` is accepted for symmetry with explain and not used by the build."""

    model_config = ConfigDict(extra="forbid")

    base: dict[str, Any] = Field(description="vq.placement-fleet/1")
    now: str | None = Field(default=None, description="ISO 8601 time with a UTC offset")
    maxAge: int = Field(
        default=DEFAULT_MAX_AGE_SECONDS,
        ge=0,
        le=MAX_AGE_LIMIT,
        strict=True,
        description="seconds (unused by the build)",
    )
    capacity: dict[str, dict[str, Any]] | None = Field(
        default=None, description="{NAME: vq.broker-capacity/1}"
    )
    queueHistory: dict[str, dict[str, Any]] | None = Field(
        default=None, description="{LANE: {target?, jobs}}"
    )
    schedulerShape: dict[str, dict[str, str]] | None = Field(
        default=None, description="{LANE: {sinfo} | {qstat, pbsnodes}}"
    )
    runtimeRoot: dict[str, dict[str, Any]] | None = Field(
        default=None, description="{NAME: vq.runtime-generations/1}"
    )
    historyJobs: int = Field(default=50, ge=1, le=100_000, strict=True, description="--history-jobs")
    historyDays: int = Field(default=14, ge=1, le=3650, strict=True, description="--history-days")
    historyMin: int = Field(default=5, ge=1, le=100_000, strict=True, description="--history-min")


class CompareBody(BaseModel):
    """``{fleet, history, jobs?, now?, maxAge?}``: the fleet, this queue's ``vq.job-history/1``, how many
    recent finished local jobs to compare (default 50), the evaluation time and max observation age."""

    model_config = ConfigDict(extra="forbid")

    fleet: dict[str, Any] = Field(description="vq.placement-fleet/1")
    history: dict[str, Any] | None = Field(
        default=None, description="vq.job-history/1; omitted: the job records stored in this service"
    )
    jobs: int = Field(default=50, ge=1, le=100_000, strict=True)
    now: str | None = Field(default=None, description="ISO 8601 time with a UTC offset")
    maxAge: int = Field(
        default=DEFAULT_MAX_AGE_SECONDS, ge=0, le=MAX_AGE_LIMIT, strict=True, description="seconds"
    )


@router.post(
    "/v1/placement/fleet",
    operation_id="buildPlacementFleet",
    response_model=FleetBuild,
    summary="Build a fleet file from collected evidence ({fleet, report})",
)
async def build_fleet_route(body: FleetBody, principal: CurrentPrincipal) -> dict[str, Any]:
    """The base fleet with the evidence applied, and one report entry per target and source. Opens no
    SSH connection: the evidence is in the body. Refusals (unknown target, lane given a capacity answer,
    lane without a queue, relative runtime root, malformed evidence) answer 422 naming the field."""
    from app.fleet.build import HistoryOptions
    from app.fleet.build_body import build_fleet_documents

    authorize(principal, EXPLAIN, "*")
    now = _parse_now(body.now)
    return await run_in_threadpool(
        lambda: build_fleet_documents(
            body.base,
            now,
            capacity=body.capacity,
            queue_history=body.queueHistory,
            scheduler_shape=body.schedulerShape,
            runtime_root=body.runtimeRoot,
            history=HistoryOptions(jobs=body.historyJobs, days=body.historyDays, minimum=body.historyMin),
        )
    )


@router.post(
    "/v1/placement/compare",
    operation_id="comparePlacementOrderings",
    response_model=Comparison,
    summary="Compare the broker's capacity and completion-time orderings (vq.placement-compare/1)",
)
async def compare_orderings_route(
    body: CompareBody, principal: CurrentPrincipal, svc: ServicesDep
) -> dict[str, Any]:
    """Each recent finished local job placed by both orderings over the fleet's daemon snapshot:
    choices, whether they differ, blockers, and totals. Read-only."""
    from app.fleet.compare import compare_documents

    authorize(principal, EXPLAIN, "*")
    now = _parse_now(body.now)
    history = body.history
    if history is None:
        history = job_history_document(await job_records(svc.engine))
    return await run_in_threadpool(
        lambda: compare_documents(body.fleet, history, now, jobs=body.jobs, max_age_seconds=body.maxAge)
    )


@router.put(
    "/v1/placement/jobs/{job_id}",
    operation_id="recordPlacementJob",
    response_model=JobRecord,
    summary="Record (or replace) one job record for queue history and compare",
)
async def record_job_route(
    job_id: str, body: JobRecord, principal: CurrentPrincipal, svc: ServicesDep
) -> dict[str, Any]:
    """Store a job record (``scheduler_submitted_at`` / ``scheduler_started_at`` feed the queue-wait
    history of ``target``); the path's ``job_id`` must equal the body's."""
    authorize(principal, "compute:inventory:write", "*")
    if body.job_id != job_id:
        raise InvalidInput(
            f"job_id {quote_input(body.job_id)} differs from the path's {quote_input(job_id)}", path="job_id"
        )
    stored = stored_record(body)
    await record_job(svc.engine, body.job_id, body.target or "", stored)
    return stored


@router.get(
    "/v1/placement/jobs",
    operation_id="listPlacementJobs",
    response_model=JobHistory,
    summary="The stored job records as vq.job-history/1",
)
async def job_history_route(
    principal: CurrentPrincipal,
    svc: ServicesDep,
    kind: Literal["local", "scheduler"] | None = Query(default=None),
    target: str | None = Query(default=None, max_length=256),
    limit: int = Query(default=10_000, ge=1, le=100_000),
) -> dict[str, Any]:
    """Newest recorded first."""
    authorize(principal, EXPLAIN, "*")
    return job_history_document(await job_records(svc.engine, kind, target, limit))
