"""Reservation and preview answers (docs/api.md, "HTTP API", response shapes; docs/placement-rules.md,
preview)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.answers.common import NEXT_CURSOR, ApiModel, Number, Timestamp
from app.answers.statuses import ReservationStatus


class RejectionRow(ApiModel):
    """``count`` nodes the filter ``filter`` rejected with ``reason``, up to 5 of them named; the rows'
    counts add up to the pool's node count (docs/reasons.md, "Rejection rows")."""

    filter: str = Field(
        description="The filter that rejected them: schedulable, labels, scalars, selector, ..."
    )
    reason: str
    count: int
    nodes: list[str] = Field(description="Up to 5 of the nodes' names, in the pool's node order")


class NearestMiss(ApiModel):
    """A node close to fitting and what it lacks (docs/reasons.md, "Nearest misses")."""

    nodeId: str
    nodeName: str
    filter: str = Field(description="The filter that rejected it")
    reason: str = Field(description="That filter's reason")
    shortfall: str = Field(description="What it lacks in the request's terms, e.g. '3 of 4 gpu free'")
    missingAtoms: int = Field(description="Atoms it lacks, over the device requests")


class Condition(ApiModel):
    """One step of a reservation's story, e.g. ``Unschedulable`` (reason ``NoFit``) with its message."""

    type: str = Field(
        description="Unschedulable, Planned, Scheduled, Repaired, Preempted, Extended, Ended or Released"
    )
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str
    at: Timestamp | None = Field(
        default=None,
        description="When it happened (Scheduled, Repaired, Preempted, Extended, Released); Planned: the "
        "planned start",
    )
    waitedSeconds: float | None = Field(
        default=None, description="Scheduled: how long the reservation waited pending (seconds)"
    )
    nodeId: str | None = Field(default=None, description="Planned: the node of the planned window")
    oldNodeId: str | None = Field(default=None, description="Repaired: the node the work was booked on")
    oldAtoms: list[str] | None = Field(default=None, description="Repaired: the atoms it was booked on")
    newNodeId: str | None = Field(default=None, description="Repaired: the node it moved to (null: pending)")
    newAtoms: list[str] | None = Field(default=None, description="Repaired: the atoms it moved to")
    oldEnd: Timestamp | None = Field(default=None, description="Extended: the end before the extension")
    newEnd: Timestamp | None = Field(default=None, description="Extended: the end after it")
    reservationIds: list[str] | None = Field(
        default=None, description="Preempted (the preemptor): the victims of its own tenant"
    )
    hiddenReservations: int | None = Field(
        default=None, description="Preempted (the preemptor): victims of other tenants, counted, never named"
    )
    rejections: list[RejectionRow] | None = Field(
        default=None, description="Unschedulable (NoFit): one row per distinct reason of the latest plan"
    )
    nearestMisses: list[NearestMiss] | None = Field(
        default=None, description="Unschedulable (NoFit): up to 3 nodes closest to fitting"
    )


class Allocation(ApiModel):
    """What one node holds for a reservation over ``[start, end)``: atoms and scalar amounts."""

    id: str
    nodeId: str
    atoms: list[str]
    resources: dict[str, Number]
    start: Timestamp = Field(description="ISO 8601, inclusive")
    end: Timestamp = Field(description="ISO 8601, exclusive")
    releasedAt: Timestamp | None = Field(description="ISO 8601; null while held")


class MatchExpressionSpec(ApiModel):
    """A selector expression as stored (shorthand selectors are stored in this form)."""

    key: str
    op: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Gte", "Lt", "Lte"]
    values: list[str | int | float] | None = None


class SelectorSpec(ApiModel):
    """``{matchExpressions: [...]}``."""

    matchExpressions: list[MatchExpressionSpec]


class DeviceRequestSpec(ApiModel):
    """One device request as stored: ``{class, count, selector, topology}``."""

    device_class: str = Field(alias="class")
    count: int
    selector: SelectorSpec | None
    topology: Literal["nvlink-all"] | None


class GangSpec(ApiModel):
    """``{members, topologyKey}``."""

    members: int
    topologyKey: str | None


class ReservationSpec(ApiModel):
    """The request as stored with the reservation (the body without ``idempotencyKey``)."""

    tenantId: str
    poolId: str
    devices: list[DeviceRequestSpec]
    resources: dict[str, Number]
    start: Timestamp | None = Field(
        description="ISO 8601, or 'earliest' (the first window that fit, docs/lifecycle.md); null: the "
        "database's now when placed"
    )
    duration: str | int
    deadline: Timestamp | None = Field(
        default=None,
        description="ISO 8601; still pending or queued then, it is ended (DeadlinePassed); null: none",
    )
    binding: Literal["device", "node", "kubernetes"]
    gang: GangSpec | None
    spot: bool


class Reservation(ApiModel):
    """A reservation: ``placed`` with allocations, ``pending`` with an Unschedulable condition, ..."""

    id: str
    tenantId: str
    poolId: str
    status: ReservationStatus
    idempotencyKey: str
    spec: ReservationSpec
    allocations: list[Allocation] = Field(description="What it holds or held; a planned window is not listed")
    conditions: list[Condition]
    plannedStart: Timestamp | None = Field(
        description="Pending: the start of its planned window (docs/lifecycle.md, Planned starts); else null"
    )
    createdAt: Timestamp = Field(description="ISO 8601")
    releasedAt: Timestamp | None = Field(description="ISO 8601; null until released")
    warnings: list[str] | None = Field(
        default=None,
        description="On a create's answer only: selector keys that no device or node of the pool carries",
    )


class ReservationList(ApiModel):
    """A page of reservations, newest first."""

    items: list[Reservation]
    nextCursor: str | None = NEXT_CURSOR


class Candidate(ApiModel):
    """A node the request would fit on: the atoms picked, the total score and each scorer's score."""

    nodeId: str
    nodeName: str
    atoms: list[str]
    score: float
    scores: dict[str, float]
    planToken: str | None = Field(
        default=None,
        description="Commit exactly this candidate with POST /v1/reservations ifPlan (docs/api.md, Plan "
        "tokens); absent for a gang's members",
    )


class PreemptibleCandidate(ApiModel):
    """A node a regular request would take by preempting spot work there: the atoms and the victims."""

    nodeId: str
    nodeName: str
    atoms: list[str]
    victims: int = Field(description="Spot reservations preempted on this node")


class Preemptible(ApiModel):
    """A regular request that fits only by preempting spot work (docs/preemption.md)."""

    reservations: int = Field(description="Spot reservations it would preempt")
    startsAt: Timestamp = Field(description="When the preemptor's window would start")
    candidates: list[PreemptibleCandidate] = Field(description="The node it would take (a gang: its members)")
    reservationIds: list[str] = Field(description="The victims of the request's tenant")
    hiddenReservations: int = Field(description="Victims of other tenants, counted, never named")


class EarliestMember(ApiModel):
    """One node of an earliest window: the node and the atoms the plan at that start picked."""

    nodeId: str
    nodeName: str
    atoms: list[str]


class Earliest(ApiModel):
    """The first window at or after the requested start at which the whole request fits
    (docs/lifecycle.md, "Earliest start"): the best node of the plan at that start and its atoms; for a
    gang, the first member's, with every member in ``members``."""

    start: Timestamp = Field(description="ISO 8601, inclusive")
    end: Timestamp = Field(description="ISO 8601, exclusive: start + duration")
    nodeId: str
    nodeName: str
    atoms: list[str]
    members: list[EarliestMember] | None = Field(
        default=None, description="A gang's members at that start, the first one first; absent otherwise"
    )


class Preview(ApiModel):
    """``{fits, candidates, reason?, preemptible?}``: up to 10 candidates best first (a gang: its
    members), or why not, and what preempting spot work would do."""

    fits: bool
    candidates: list[Candidate]
    reason: str | None = Field(default=None, description="Why nothing fits; absent when it fits")
    satisfiable: bool | None = Field(
        default=None,
        description="false: no node of the pool, as it is built now, could ever hold the request "
        "(unsatisfiableReason says why); absent otherwise",
    )
    unsatisfiableReason: str | None = Field(
        default=None,
        description="With satisfiable false: the largest shape the pool could hold, e.g. 'no node of pool "
        "demo can hold 100 gpu: the largest has 8'",
    )
    warnings: list[str] | None = Field(
        default=None, description="Selector keys that no device or node of the pool carries"
    )
    preemptible: Preemptible | None = Field(
        default=None, description="A regular request that fits only by preempting spot work"
    )
    earliest: Earliest | None = Field(
        default=None,
        description="When it does not fit for its window: the first window within BC_CAPACITY_MAX_LEAD "
        "at which it fits, or null (earliestReason says why); absent when it fits",
    )
    earliestReason: str | None = Field(default=None, description="Why earliest is null; absent otherwise")
    rejections: list[RejectionRow] | None = Field(
        default=None,
        description="When it does not fit: one row per distinct reason, counts adding up to the pool's nodes",
    )
    nearestMisses: list[NearestMiss] | None = Field(
        default=None, description="When it does not fit: up to 3 nodes closest to fitting, closest first"
    )
    planToken: str | None = Field(
        default=None,
        description="When it fits: the best candidate's plan token (a gang: all its members'), for "
        "POST /v1/reservations ifPlan (docs/api.md, Plan tokens); absent otherwise",
    )


class ItemError(ApiModel):
    """An item's error: the standard error body's ``{code, message, details}``."""

    code: str
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class ReservationBatchItem(ApiModel):
    """One item's answer: its HTTP ``status`` (201, 200 for an idempotent retry, or the error's) and the
    reservation, or the error."""

    status: int = Field(description="The HTTP status this item alone would have answered")
    reservation: Reservation | None = Field(default=None, description="Absent when the item failed")
    error: ItemError | None = Field(default=None, description="Absent when the item succeeded")


class ReservationBatch(ApiModel):
    """``POST /v1/reservations/batch``: one answer per item, in the items' order."""

    items: list[ReservationBatchItem]


class ReservationBatchRequest(BaseModel):
    """``{items: [ReservationRequest, ...]}``: 1 to 256 reservation requests, each checked on its own
    (an item that is not a valid ReservationRequest is answered 422 alone)."""

    model_config = ConfigDict(extra="forbid")

    items: list[Any] = Field(
        min_length=1,
        max_length=256,
        description="Each a ReservationRequest (POST /v1/reservations's body)",
        json_schema_extra={"items": {"$ref": "#/components/schemas/ReservationRequest"}},
    )
