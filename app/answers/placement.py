"""Placement answers (docs/explain.md): vq.placement-explanation/1, the fleet build, vq.placement-compare/1
and
the stored job records (``vq.job-history/1``, modelled in :mod:`app.fleet.history`).

The vq.* documents keep their own snake_case field names. Optional fields the document leaves out are
left out of the answer too (the routes serialise with ``exclude_unset``): an omitted field is unknown.
Seconds throughout, MB for sizes, MB/s for rates.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.answers.common import ApiModel, Number, Timestamp
from app.fleet.build import Outcome, Source
from app.fleet.history import JobHistory, JobRecord

__all__ = [
    "BuildReportEntry",
    "Comparison",
    "Explanation",
    "FleetBuild",
    "FleetDocument",
    "JobHistory",
    "JobRecord",
]

TargetKind = Literal["daemon", "scheduler"]


class RuntimeRangeDocument(ApiModel):
    """Execution time on a speed-1.0 target, ``0 < low <= high`` seconds."""

    low: Number
    high: Number


class RequestDocument(ApiModel):
    """The effective ``vq.placement-request/1`` (after any estimate fill); unknown fields left out."""

    schema_name: Literal["vq.placement-request/1"]
    program: str
    runtime_digest: str | None = None
    os: str | None = None
    isa_level: str | None = None
    account: str | None = None
    queue: str | None = None
    required_data_access: list[str] | None = None
    required_licenses: list[str] | None = None
    cpus: int
    nodes: int
    mem_mb_per_node: int | None = None
    mpi_ranks: int | None = None
    threads_per_rank: int | None = None
    scratch_mb_per_node: int | None = None
    gpus_per_node: int | None = None
    wall_time_seconds: int | None = None
    runtime_seconds: RuntimeRangeDocument | None = None
    input_mb: Number | None = None
    output_mb: Number | None = None


class EstimateField(ApiModel):
    """What a calibrated estimate did to one request field: ``value`` when filled or kept, else ``reason``."""

    field: Literal["runtime_seconds", "mem_mb_per_node"]
    outcome: Literal["filled", "kept", "not filled"]
    value: int | RuntimeRangeDocument | None = None
    reason: str | None = None


class EstimateReport(ApiModel):
    """The ``vq.calibrated-estimate/1`` applied to the request."""

    estimate_digest: str
    calibration_id: str
    hardware_class: str
    fields: list[EstimateField]


class Selected(ApiModel):
    """The chosen target and the runtime it runs."""

    target: str
    runtime_digest: str


class Component(ApiModel):
    """One completion component: ``known`` with ``[low, high]`` seconds and ``source`` (``note``
    optional), or unknown with its ``reason``."""

    known: bool
    low: Number | None = None
    high: Number | None = None
    source: str | None = None
    note: str | None = None
    reason: str | None = None


class Completion(ApiModel):
    """The predicted completion: ``complete`` with ``low``/``high``/``midpoint`` seconds, or the known
    part (``known_low``/``known_high``) and the ``unknown`` components."""

    complete: bool
    low: Number | None = None
    high: Number | None = None
    midpoint: Number | None = None
    known_low: Number | None = None
    known_high: Number | None = None
    unknown: list[str] | None = None


class ExplanationCandidate(ApiModel):
    """An eligible target, ranked (1 = best), with its components and completion."""

    rank: int
    target: str
    kind: TargetKind
    runtime_digest: str
    observed_at: Timestamp | None
    data_age_seconds: Number | None
    speed_factor: Number
    speed_source: str | None
    components: dict[str, Component]
    completion: Completion


class Rejection(ApiModel):
    """A target failing hard requirements, with every reason (seed order)."""

    target: str
    kind: TargetKind
    observed_at: Timestamp | None
    data_age_seconds: Number | None
    reasons: list[str]


class Explanation(ApiModel):
    """``vq.placement-explanation/1`` (``openapi/vq.placement-explanation-1.schema.json``)."""

    schema_name: Literal["vq.placement-explanation/1"]
    now: Timestamp = Field(description="ISO 8601")
    max_age_seconds: int
    request: RequestDocument
    estimate: EstimateReport | None = None
    held: bool
    held_reason: str | None
    selected: Selected | None
    candidates: list[ExplanationCandidate]
    rejected: list[Rejection]


class NodeShapeDocument(ApiModel):
    """One compute node as one job gets it (counts, MB); absent = unknown."""

    cpus: int | None = None
    mem_mb: int | None = None
    scratch_mb: int | None = None
    gpus: int | None = None


class FreeCapacityDocument(ApiModel):
    """A daemon host's capacity right now."""

    cpus: int
    mem_mb: int
    scratch_mb: int | None = None
    gpus: int | None = None


class QueueWaitDocument(ApiModel):
    """A queue-wait interval in seconds with its source."""

    low: Number
    high: Number
    source: Literal["history", "declared", "scheduler-estimate"]


class FleetTargetDocument(ApiModel):
    """One target of ``vq.placement-fleet/1`` as written (fields it does not state are left out)."""

    name: str
    kind: TargetKind
    observed_at: Timestamp | None = None
    reachable: bool | None = None
    maintenance: bool | None = None
    os: str | None = None
    arch: str | None = None
    isa_levels: list[str] | None = None
    programs: dict[str, list[str]] | None = None
    accounts: list[str] | None = None
    queue: str | None = None
    data_access: list[str] | None = None
    licenses: list[str] | None = None
    node: NodeShapeDocument | None = None
    max_nodes: int | None = None
    max_walltime_seconds: int | None = None
    walltime_unlimited: bool | None = None
    free: FreeCapacityDocument | None = None
    queue_wait_seconds: QueueWaitDocument | None = None
    speed_factor: Number | None = None
    speed_source: Literal["benchmark", "declared", "assumed"] | None = None
    staging_mb_per_second: Number | None = None
    transfer_mb_per_second: Number | None = None


class FleetDocument(ApiModel):
    """``vq.placement-fleet/1``."""

    schema_name: Literal["vq.placement-fleet/1"]
    targets: list[FleetTargetDocument]


class BuildReportEntry(ApiModel):
    """One line of the build report: what each evidence source did to a target."""

    target: str
    source: Source
    outcome: Outcome
    message: str


class FleetBuild(ApiModel):
    """``{fleet, report}``: the base fleet with the evidence applied, and the report."""

    fleet: FleetDocument
    report: list[BuildReportEntry]


class OrderingChoice(ApiModel):
    """One ordering's decision for a job: the chosen target (null = held) and each blocked target."""

    choice: str | None
    held: bool
    blockers: dict[str, list[str]]


class ComparedJob(ApiModel):
    """A compared job: its figures and both orderings' choices."""

    job_id: str
    program: str | None
    cpus: int | None
    mem_mb: int | None
    wall_time_seconds: int | None
    capacity: OrderingChoice
    completion_time: OrderingChoice
    differ: bool


class CompareTotals(ApiModel):
    """How many jobs were compared, chose the same, differed, were held by either, were skipped."""

    compared: int
    same: int
    different: int
    held_by_either: int
    skipped: int


class SkippedJob(ApiModel):
    """A job left out of the comparison, and why."""

    job_id: str
    reason: str


class Comparison(ApiModel):
    """``vq.placement-compare/1`` (docs/fleet.md)."""

    schema_name: Literal["vq.placement-compare/1"]
    now: Timestamp = Field(description="ISO 8601")
    max_age_seconds: int
    totals: CompareTotals
    jobs: list[ComparedJob]
    skipped: list[SkippedJob]
