"""The HTTP face of the fleet build: evidence the caller already collected, as parsed JSON in the request
body, checked by the CLI's refusals (:func:`app.fleet.build_plan.check_plan`) with errors that name the
body field, then applied by :func:`app.fleet.build.build_fleet`. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any

from pydantic import ValidationError

from app.errors import InvalidInput, quote_input
from app.fleet.build import (
    CapacityEvidence,
    FleetEvidence,
    HistoryOptions,
    RuntimeEvidence,
    ShapeEvidence,
    build_fleet,
)
from app.fleet.build_plan import BuildPlan, FleetBuildRefused, check_plan
from app.fleet.capacity import load_capacity_answer
from app.fleet.documents import PlacementFleet, as_invalid_input, load_fleet
from app.fleet.history import JobRecord
from app.fleet.runtimes import load_runtime_listing

_BODY_FIELDS = {
    "capacity": "capacity",
    "queue-history": "queueHistory",
    "scheduler-shape": "schedulerShape",
    "runtime-root": "runtimeRoot",
}


def _prefixed(error: InvalidInput, prefix: str) -> InvalidInput:
    """A body document's error as a refusal naming the body field: ``capacity.workstation.free_cpus``."""
    return error.under(prefix, label=prefix, as_type=FleetBuildRefused)


def _capacity_documents(capacity: Mapping[str, Any]) -> dict[str, CapacityEvidence]:
    """``{NAME: vq.broker-capacity/1}`` as evidence; errors name ``capacity.NAME.<field>``."""
    answers: dict[str, CapacityEvidence] = {}
    for name, data in capacity.items():
        try:
            answers[name] = CapacityEvidence(answer=load_capacity_answer(data))
        except InvalidInput as error:
            raise _prefixed(error, f"capacity.{name}") from None
    return answers


def _history_documents(
    queue_history: Mapping[str, Any],
) -> tuple[list[tuple[str, str]], dict[str, list[JobRecord]]]:
    """``{LANE: {target?, jobs: [job record]}}`` as (lane, scheduler target) pairs and each lane's jobs;
    errors name ``queueHistory.LANE...``."""
    pairs: list[tuple[str, str]] = []
    lane_jobs: dict[str, list[JobRecord]] = {}
    for lane, entry in queue_history.items():
        where = f"queueHistory.{lane}"
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("jobs"), list)
            or set(entry) - {"target", "jobs"}
        ):
            raise FleetBuildRefused(f"{where}: want {{target?, jobs: [job record]}}", path=where)
        scheduler_target = entry.get("target") or lane
        if not isinstance(scheduler_target, str):
            raise FleetBuildRefused(f"{where}.target: must be a string", path=f"{where}.target")
        lane_jobs[lane] = []
        for i, record in enumerate(entry["jobs"]):
            try:
                lane_jobs[lane].append(JobRecord.model_validate(record))
            except ValidationError as error:
                raise _prefixed(as_invalid_input(error, "job record"), f"{where}.jobs.{i}") from None
        pairs.append((lane, scheduler_target))
    return pairs, lane_jobs


def _shape_document(lane: str, entry: Any) -> ShapeEvidence:
    """``{sinfo: TEXT}`` (Slurm) or ``{qstat: TEXT, pbsnodes?: TEXT}`` (PBS) as evidence."""
    if isinstance(entry, dict) and set(entry) == {"sinfo"} and isinstance(entry["sinfo"], str):
        return ShapeEvidence("slurm", sinfo=entry["sinfo"])
    if (
        isinstance(entry, dict)
        and "qstat" in entry
        and set(entry) <= {"qstat", "pbsnodes"}
        and all(isinstance(v, str) for v in entry.values())
    ):
        pbsnodes = entry.get("pbsnodes")
        return ShapeEvidence(
            "pbs", qstat=entry["qstat"], pbsnodes=pbsnodes, pbsnodes_failure=None if pbsnodes else "not given"
        )
    where = f"schedulerShape.{lane}"
    raise FleetBuildRefused(f"{where}: want {{sinfo: TEXT}} or {{qstat: TEXT, pbsnodes: TEXT}}", path=where)


def _runtime_documents(runtime_root: Mapping[str, Any]) -> dict[str, RuntimeEvidence]:
    """``{NAME: vq.runtime-generations/1}`` as evidence; each listing's ``root`` must be absolute."""
    runtimes: dict[str, RuntimeEvidence] = {}
    for name, data in runtime_root.items():
        try:
            listing = load_runtime_listing(data)
        except InvalidInput as error:
            raise _prefixed(error, f"runtimeRoot.{name}") from None
        if not PurePosixPath(listing.root).is_absolute():
            raise FleetBuildRefused(
                f"runtimeRoot.{name}.root: {quote_input(listing.root)} is not an absolute path",
                path=f"runtimeRoot.{name}.root",
            )
        runtimes[name] = RuntimeEvidence(listing=listing)
    return runtimes


def _check_body_plan(
    fleet: PlacementFleet,
    answers: Mapping[str, CapacityEvidence],
    pairs: list[tuple[str, str]],
    shapes: Mapping[str, ShapeEvidence],
    runtimes: Mapping[str, RuntimeEvidence],
) -> None:
    """The CLI's refusals (:func:`check_plan`) over the body's evidence, naming the body field."""
    plan = BuildPlan(
        capacity=tuple(answers),
        queue_history=tuple((lane, lane) for lane, _ in pairs),
        scheduler_shape=tuple((lane, "") for lane in shapes),
        runtime_root=tuple((name, runtimes[name].listing.root) for name in runtimes),  # type: ignore[union-attr]
    )
    try:
        check_plan(fleet, plan, None, {lane: shape.scheduler for lane, shape in shapes.items()})
    except FleetBuildRefused as refusal:  # name the body field, not the CLI option
        option, _, rest = (refusal.path or "").partition(".")
        path = f"{_BODY_FIELDS.get(option, option)}.{rest}"
        raise FleetBuildRefused(refusal.message, path=path) from None


def build_fleet_documents(
    base: Any,
    now: datetime,
    *,
    capacity: Mapping[str, Any] | None = None,
    queue_history: Mapping[str, Any] | None = None,
    scheduler_shape: Mapping[str, Any] | None = None,
    runtime_root: Mapping[str, Any] | None = None,
    history: HistoryOptions = HistoryOptions(),
) -> dict[str, Any]:
    """The HTTP face of the build: evidence the caller already collected, as parsed JSON.

    ``capacity``: ``{NAME: vq.broker-capacity/1}``; ``queue_history``: ``{LANE: {target?, jobs:
    [job record]}}`` (target defaults to LANE); ``scheduler_shape``: ``{LANE: {sinfo: TEXT}}`` or
    ``{LANE: {qstat: TEXT, pbsnodes?: TEXT}}``; ``runtime_root``: ``{NAME: vq.runtime-generations/1}``
    (its ``root`` must be absolute). Same rules and refusals as the CLI, without hosts. Returns
    ``{fleet, report}``; raises :class:`InvalidInput` whose path names the body field, e.g.
    ``capacity.workstation.free_cpus``.
    """
    try:
        fleet = load_fleet(base)
    except InvalidInput as error:
        raise _prefixed(error, "base") from None
    answers = _capacity_documents(capacity or {})
    pairs, lane_jobs = _history_documents(queue_history or {})
    shapes = {lane: _shape_document(lane, entry) for lane, entry in (scheduler_shape or {}).items()}
    runtimes = _runtime_documents(runtime_root or {})
    _check_body_plan(fleet, answers, pairs, shapes, runtimes)
    evidence = FleetEvidence(
        capacity=answers,
        queue_history=pairs,
        lane_jobs=lane_jobs,
        history=history,
        shapes=shapes,
        runtimes=runtimes,
    )
    return build_fleet(fleet, evidence, now).to_json()
