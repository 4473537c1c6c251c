"""Build a fleet file from live evidence (docs/fleet.md).

Two pure steps, with the SSH collection (``app/fleet/collect.py``) between them:

1. :func:`app.fleet.build_plan.check_plan` refuses, before any host is contacted, everything docs/fleet.md
   refuses (:mod:`app.fleet.build_plan`).
2. :func:`build_fleet` applies the evidence (answers, job records, scheduler output, runtime listings)
   to the base fleet in a fixed order: runtime roots, capacity answers, queue history, scheduler shapes.
   Everything it cannot use is reported (``ReportEntry``), never guessed; the build goes on.

Pure: the base fleet, the evidence and ``now`` in; the fleet and the report out. The HTTP body's
evidence is read by :mod:`app.fleet.build_body`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from app.fleet.build_plan import Scheduler
from app.fleet.capacity import CapacityAnswer, overlay_capacity
from app.fleet.documents import PlacementFleet, dump_document, load_fleet
from app.fleet.history import (
    DEFAULT_HISTORY_DAYS,
    DEFAULT_HISTORY_JOBS,
    DEFAULT_HISTORY_MIN,
    JobRecord,
    queue_wait_from_history,
)
from app.fleet.pbs import PbsParseError, queue_limits, queue_node_shape
from app.fleet.runtimes import RuntimeListing, overlay_runtimes
from app.fleet.slurm import SlurmParseError, parse_sinfo_shape

Source = Literal["capacity", "collect", "queue-history", "scheduler-shape", "runtime-root"]
Outcome = Literal["applied", "kept", "unreachable"]


@dataclass(frozen=True)
class ReportEntry:
    """One line of the build report: ``target``, evidence ``source``, ``outcome`` (``applied``,
    ``kept`` = base record kept, ``unreachable`` = recorded reachable false) and a ``message``."""

    target: str
    source: Source
    outcome: Outcome
    message: str

    def to_json(self) -> dict[str, str]:
        """``{target, source, outcome, message}``."""
        return {
            "target": self.target,
            "source": self.source,
            "outcome": self.outcome,
            "message": self.message,
        }

    def line(self) -> str:
        """The stderr line: ``<target>: <source>: <outcome>: <message>``."""
        return f"{self.target}: {self.source}: {self.outcome}: {self.message}"


@dataclass(frozen=True)
class CapacityEvidence:
    """A daemon's capacity answer (``answered_at``: this host's clock at the call for ``--collect``;
    ``None`` to date by the answer's ``sampled_at``), or the ``failure`` that left it without one."""

    answer: CapacityAnswer | None = None
    answered_at: datetime | None = None
    failure: str | None = None


@dataclass(frozen=True)
class ShapeEvidence:
    """Scheduler output for one lane: Slurm ``sinfo`` text, or PBS ``qstat`` and ``pbsnodes`` text; a
    ``failure`` when the primary command (sinfo / qstat) gave nothing, ``pbsnodes_failure`` likewise."""

    scheduler: Scheduler
    sinfo: str | None = None
    qstat: str | None = None
    pbsnodes: str | None = None
    failure: str | None = None
    pbsnodes_failure: str | None = None


@dataclass(frozen=True)
class RuntimeEvidence:
    """A deployment root's listing, or the ``failure`` that left the target without one."""

    listing: RuntimeListing | None = None
    failure: str | None = None


@dataclass(frozen=True)
class HistoryOptions:
    """``--history-jobs`` (50), ``--history-days`` (14), ``--history-min`` (5)."""

    jobs: int = DEFAULT_HISTORY_JOBS
    days: int = DEFAULT_HISTORY_DAYS
    minimum: int = DEFAULT_HISTORY_MIN


@dataclass(frozen=True)
class FleetEvidence:
    """Everything the build applies. ``capacity`` holds ``--capacity`` answers, ``collected`` the
    ``--collect`` results; ``queue_history`` (lane, scheduler target) pairs read ``jobs`` (this host's
    queue), or the lane's own ``lane_jobs`` when given (the HTTP body carries records per lane)."""

    capacity: Mapping[str, CapacityEvidence] = field(default_factory=dict)
    collected: Mapping[str, CapacityEvidence] = field(default_factory=dict)
    queue_history: Sequence[tuple[str, str]] = ()
    jobs: Sequence[JobRecord] = ()
    lane_jobs: Mapping[str, Sequence[JobRecord]] = field(default_factory=dict)
    history: HistoryOptions = HistoryOptions()
    shapes: Mapping[str, ShapeEvidence] = field(default_factory=dict)
    runtimes: Mapping[str, RuntimeEvidence] = field(default_factory=dict)


@dataclass(frozen=True)
class BuildResult:
    """The built ``vq.placement-fleet/1`` and the report, one entry per evidence source and target."""

    fleet: PlacementFleet
    report: tuple[ReportEntry, ...]

    def to_json(self) -> dict[str, Any]:
        """``{fleet: <vq.placement-fleet/1>, report: [{target, source, outcome, message}]}``."""
        return {
            "fleet": dump_document(self.fleet, only_given=True),
            "report": [entry.to_json() for entry in self.report],
        }


def _unreachable(record: dict[str, Any], now: datetime) -> dict[str, Any]:
    record = dict(record)
    record["reachable"] = False
    record["observed_at"] = now.isoformat()
    record.pop("free", None)
    return record


def _set_limits(
    record: dict[str, Any], notes: list[str], walltime: int | None, max_nodes: int | None, no_walltime: str
) -> None:
    """A scheduler's queue limits into the target ``record``, each with its note: a known walltime
    (``max walltime <n> s``) or, when the scheduler shows none, the kept one (``<no_walltime>: walltime
    kept``); then the node limit (:func:`_set_max_nodes`)."""
    if walltime is not None:
        record["max_walltime_seconds"] = walltime
        record["walltime_unlimited"] = False
        notes.append(f"max walltime {walltime} s")
    else:
        notes.append(f"{no_walltime}: walltime kept")
    _set_max_nodes(record, notes, max_nodes)


def _set_max_nodes(record: dict[str, Any], notes: list[str], max_nodes: int | None) -> None:
    """``max_nodes`` into ``record`` with the note ``max nodes <n>``; None keeps the record's."""
    if max_nodes is not None:
        record["max_nodes"] = max_nodes
        notes.append(f"max nodes {max_nodes}")


def _apply_slurm(record: dict[str, Any], sinfo: str, now: datetime) -> tuple[dict[str, Any], str]:
    shape = parse_sinfo_shape(sinfo)
    record = dict(record)
    record["node"] = {
        **(record.get("node") or {}),
        "cpus": shape.cpus,
        "mem_mb": shape.mem_mb,
        "gpus": shape.gpus,
    }
    notes = [
        f"node {shape.cpus} cpus, {shape.mem_mb} MB, {shape.gpus} gpus (smallest of {shape.groups} groups)"
    ]
    if shape.walltime_unlimited:
        record.pop("max_walltime_seconds", None)
        record["walltime_unlimited"] = True
        notes.append("walltime unlimited")
        _set_max_nodes(record, notes, shape.max_nodes)
    else:
        _set_limits(record, notes, shape.max_walltime_seconds, shape.max_nodes, "time limit n/a")
    record["observed_at"] = now.isoformat()
    record["reachable"] = True
    return record, "; ".join(notes)


def _apply_pbs(
    record: dict[str, Any], queue: str, evidence: ShapeEvidence, now: datetime
) -> tuple[dict[str, Any], str]:
    limits = queue_limits(evidence.qstat or "", queue)
    record = dict(record)
    notes = []
    _set_limits(record, notes, limits.max_walltime_seconds, limits.max_nodes, "no resources_max.walltime")
    if limits.maintenance:
        record["maintenance"] = True
        notes.append("queue disabled or stopped: maintenance")
    record["observed_at"] = now.isoformat()
    record["reachable"] = True
    if evidence.pbsnodes is None:
        notes.append(f"node record kept: pbsnodes failed: {evidence.pbsnodes_failure or 'no output'}")
        return record, "; ".join(notes)
    try:
        shape = queue_node_shape(evidence.qstat or "", queue, evidence.pbsnodes)
    except PbsParseError as error:
        notes.append(f"node record kept: pbsnodes unparsable: {error}")
        return record, "; ".join(notes)
    if shape is None:
        notes.append(f"node record kept: queue {queue} routes to no usable node")
        return record, "; ".join(notes)
    record["node"] = {
        **(record.get("node") or {}),
        "cpus": shape.cpus,
        "mem_mb": shape.mem_mb,
        "gpus": shape.gpus,
    }
    notes.append(
        f"node {shape.cpus} cpus, {shape.mem_mb} MB, {shape.gpus} gpus (smallest of {shape.nodes} nodes)"
    )
    return record, "; ".join(notes)


Record = dict[str, Any]


def _with_runtimes(name: str, record: Record, runtime: RuntimeEvidence) -> tuple[Record, ReportEntry]:
    """A runtime root's listing over the record's programs (none: programs kept)."""
    if runtime.listing is None:
        return record, ReportEntry(
            name, "runtime-root", "kept", f"no listing ({runtime.failure}): programs kept"
        )
    programs, skipped = overlay_runtimes(record.get("programs") or {}, runtime.listing)
    changed = sorted(p for p in programs if programs[p] != (record.get("programs") or {}).get(p))
    message = f"programs from {runtime.listing.root}: " + (", ".join(changed) or "none changed")
    if skipped:
        message += "; skipped: " + "; ".join(skipped)
    return {**record, "programs": programs}, ReportEntry(name, "runtime-root", "applied", message)


def _with_capacity(
    name: str, source: str, record: Record, item: CapacityEvidence, now: datetime
) -> tuple[Record, ReportEntry]:
    """A capacity answer over a daemon's record (none: unreachable, observed now, nothing free)."""
    if item.answer is None:
        entry = ReportEntry(name, source, "unreachable", f"no answer ({item.failure}): nothing free")  # type: ignore[arg-type]
        return _unreachable(record, now), entry
    overlaid, summary = overlay_capacity(record, item.answer, item.answered_at)
    outcome: Outcome = "applied" if item.answer.state_root_used else "unreachable"
    return overlaid, ReportEntry(name, source, outcome, summary)  # type: ignore[arg-type]


def _with_history(
    lane: str, scheduler_target: str, record: Record, evidence: FleetEvidence, now: datetime
) -> tuple[Record, ReportEntry]:
    """The lane's queue wait from the recorded waits of ``scheduler_target`` (too few: record kept)."""
    outcome = queue_wait_from_history(
        list(evidence.lane_jobs.get(lane, evidence.jobs)),
        scheduler_target,
        now,
        jobs=evidence.history.jobs,
        days=evidence.history.days,
        minimum=evidence.history.minimum,
    )
    message = f"target {scheduler_target}: {outcome.message(evidence.history.minimum)}"
    if outcome.queue_wait is None:
        return record, ReportEntry(lane, "queue-history", "kept", message)
    updated = {**record, "queue_wait_seconds": outcome.queue_wait.model_dump()}
    return updated, ReportEntry(lane, "queue-history", "applied", message)


def _with_shape(lane: str, record: Record, shape: ShapeEvidence, now: datetime) -> tuple[Record, ReportEntry]:
    """A Slurm or PBS answer over the lane (no answer, or none parseable: unreachable, observed now)."""
    if shape.failure is not None:
        entry = ReportEntry(lane, "scheduler-shape", "unreachable", f"{shape.scheduler}: {shape.failure}")
        return _unreachable(record, now), entry
    queue = record["queue"]
    try:
        if shape.scheduler == "slurm":
            updated, message = _apply_slurm(record, shape.sinfo or "", now)
        else:
            updated, message = _apply_pbs(record, queue, shape, now)
    except (SlurmParseError, PbsParseError) as error:
        failure = f"{shape.scheduler}: no parseable answer: {error}"
        return _unreachable(record, now), ReportEntry(lane, "scheduler-shape", "unreachable", failure)
    return updated, ReportEntry(lane, "scheduler-shape", "applied", f"{shape.scheduler} {queue}: {message}")


def build_fleet(base: PlacementFleet, evidence: FleetEvidence, now: datetime) -> BuildResult:
    """Apply the evidence to the base fleet (docs/fleet.md). ``now`` (timezone-aware) is this host's clock:
    failed collections and scheduler shapes are observed at ``now``.

    Order: runtime roots, capacity answers (``--capacity`` then ``--collect``), queue history,
    scheduler shapes. Targets without evidence keep their base record (their ``observed_at`` is not
    refreshed). The result is validated as ``vq.placement-fleet/1``. Call
    :func:`app.fleet.build_plan.check_plan` first.
    """
    data = dump_document(base, only_given=True)
    targets: list[Record] = data["targets"]
    index = {target["name"]: i for i, target in enumerate(targets)}
    report: list[ReportEntry] = []

    def keep(name: str, result: tuple[Record, ReportEntry]) -> None:
        targets[index[name]], entry = result
        report.append(entry)

    for name, runtime in evidence.runtimes.items():
        keep(name, _with_runtimes(name, targets[index[name]], runtime))
    for source, answers in (("capacity", evidence.capacity), ("collect", evidence.collected)):
        for name, item in answers.items():
            keep(name, _with_capacity(name, source, targets[index[name]], item, now))
    for lane, scheduler_target in evidence.queue_history:
        keep(lane, _with_history(lane, scheduler_target, targets[index[lane]], evidence, now))
    for lane, shape in evidence.shapes.items():
        keep(lane, _with_shape(lane, targets[index[lane]], shape, now))
    return BuildResult(fleet=load_fleet(data), report=tuple(report))
