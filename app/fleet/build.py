"""Build a fleet file from live evidence (seed 004, "Live daemon evidence: vq placement fleet" through
"Daemon targets: runtimes from a #161 deployment root").

Two pure steps, with the SSH collection (``app/fleet/collect.py``) between them:

1. :func:`check_plan` refuses, before any host is contacted, everything the seed refuses: an answer for
   an unknown target or a scheduler lane, two answers for one target, ``--collect`` of a lane, an unknown
   target or an unconfigured host, a target named by both ``--capacity`` and ``--collect``, a
   ``--queue-history`` target that is not a lane, a ``--scheduler-shape`` lane that is not a lane, has no
   queue, or whose host is not a configured Slurm/PBS host, the same lane twice, and a ``--runtime-root``
   target that is not a daemon, an unconfigured host, a relative ROOT or the same target twice.
2. :func:`build_fleet` applies the evidence (answers, job records, scheduler output, runtime listings)
   to the base fleet in a fixed order: runtime roots, capacity answers, queue history, scheduler shapes.
   Everything it cannot use is reported (``ReportEntry``), never guessed; the build goes on.

Pure: the base fleet, the evidence and ``now`` in; the fleet and the report out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import ValidationError

from app.errors import InvalidInput, quote_input
from app.fleet.capacity import CapacityAnswer, load_capacity_answer, overlay_capacity
from app.fleet.documents import PlacementFleet, as_invalid_input, dump_document, load_fleet
from app.fleet.history import (
    DEFAULT_HISTORY_DAYS,
    DEFAULT_HISTORY_JOBS,
    DEFAULT_HISTORY_MIN,
    JobRecord,
    queue_wait_from_history,
)
from app.fleet.pbs import PbsParseError, queue_limits, queue_node_shape
from app.fleet.runtimes import RuntimeListing, load_runtime_listing, overlay_runtimes
from app.fleet.slurm import SlurmParseError, parse_sinfo_shape

Scheduler = Literal["slurm", "pbs"]
Source = Literal["capacity", "collect", "queue-history", "scheduler-shape", "runtime-root"]
Outcome = Literal["applied", "kept", "unreachable"]


class FleetBuildRefused(InvalidInput):
    """The build is refused before any host is contacted (HTTP 422, CLI exit 2); ``path`` names the
    option and target, e.g. ``collect.cluster-a/compute``."""


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
class BuildPlan:
    """What the build is asked to do, by target name, in the order given (duplicates kept so that they
    can be refused). ``capacity``: names with an answer already in hand; ``collect``: daemons to ask over
    SSH; ``queue_history``: (lane, scheduler target); ``scheduler_shape``: (lane, host; ``""`` when the
    scheduler output is supplied directly); ``runtime_root``: (daemon, absolute ROOT; ``""`` when the
    listing is supplied directly)."""

    capacity: tuple[str, ...] = ()
    collect: tuple[str, ...] = ()
    queue_history: tuple[tuple[str, str], ...] = ()
    scheduler_shape: tuple[tuple[str, str], ...] = ()
    runtime_root: tuple[tuple[str, str], ...] = ()


def parse_assignment(text: str, option: str, *, value_required: bool) -> tuple[str, str | None]:
    """``NAME=VALUE`` (or ``NAME`` when the value is optional) from a CLI option. Target names cannot
    contain ``=``, so the first ``=`` splits. Raises :class:`FleetBuildRefused`."""
    name, sep, value = text.partition("=")
    if not name or (sep and not value):
        raise FleetBuildRefused(
            f"{option} {quote_input(text)}: want NAME{'=' if value_required else '[='}VALUE", path=option
        )
    if value_required and not sep:
        raise FleetBuildRefused(f"{option} {quote_input(text)}: want NAME=VALUE", path=option)
    return name, (value if sep else None)


def _refuse(option: str, name: str, message: str) -> FleetBuildRefused:
    return FleetBuildRefused(f"{option} {name}: {message}", path=f"{option.lstrip('-')}.{name}")


def _duplicates(names: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    repeated: list[str] = []
    for name in names:
        if name in seen and name not in repeated:
            repeated.append(name)
        seen.add(name)
    return repeated


def check_plan(
    base: PlacementFleet,
    plan: BuildPlan,
    hosts: Mapping[str, Scheduler | None] | None,
    shape_schedulers: Mapping[str, Scheduler] | None = None,
) -> None:
    """Refuse the plan before any host is contacted (seed 004's refusal lists; see the module doc).

    ``hosts`` maps each configured ``[hosts.NAME]`` to its ``scheduler`` (``None`` for a daemon host);
    ``None`` means no SSH is involved (the HTTP face: evidence supplied in the body), which skips the host
    checks. ``shape_schedulers`` gives the scheduler of directly supplied shape evidence. Raises
    :class:`FleetBuildRefused` for the first problem found.
    """
    targets = {target.name: target for target in base.targets}

    def daemon(option: str, name: str, what: str) -> None:
        target = targets.get(name)
        if target is None:
            raise _refuse(option, name, "no such target in the base fleet")
        if target.kind != "daemon":
            raise _refuse(option, name, f"is a scheduler lane, not a daemon target ({what})")

    for name in plan.capacity:
        daemon("--capacity", name, "capacity answers are for daemon hosts")
    for name in _duplicates(plan.capacity):
        raise _refuse("--capacity", name, "two answers for one target")
    for name in plan.collect:
        daemon("--collect", name, "only daemon targets are collected")
        if name in plan.capacity:
            raise _refuse("--collect", name, "named by both --capacity and --collect")
        if hosts is not None and name not in hosts:
            raise _refuse("--collect", name, "not a configured [hosts.NAME]")
    for name in _duplicates(plan.collect):
        raise _refuse("--collect", name, "named twice")

    for lane, _source in plan.queue_history:
        target = targets.get(lane)
        if target is None or target.kind != "scheduler":
            raise _refuse("--queue-history", lane, "not a scheduler lane of the fleet")
    for lane in _duplicates([lane for lane, _ in plan.queue_history]):
        raise _refuse("--queue-history", lane, "the same lane named twice")

    for lane, host in plan.scheduler_shape:
        target = targets.get(lane)
        if target is None or target.kind != "scheduler":
            raise _refuse("--scheduler-shape", lane, "not a scheduler lane of the fleet")
        if target.queue is None:
            raise _refuse("--scheduler-shape", lane, "the lane records no queue/partition")
        if hosts is not None:
            if hosts.get(host) not in ("slurm", "pbs"):
                raise _refuse(
                    "--scheduler-shape",
                    lane,
                    f"host {quote_input(host)} is not a configured Slurm or PBS host",
                )
        elif shape_schedulers is not None and lane not in shape_schedulers:
            raise _refuse("--scheduler-shape", lane, "no scheduler output given")
    for lane in _duplicates([lane for lane, _ in plan.scheduler_shape]):
        raise _refuse("--scheduler-shape", lane, "the same lane named twice")

    for name, root in plan.runtime_root:
        daemon("--runtime-root", name, "runtime roots are read from daemon hosts")
        if hosts is not None:
            if name not in hosts:
                raise _refuse("--runtime-root", name, "not a configured [hosts.NAME]")
            if not PurePosixPath(root).is_absolute():
                raise _refuse("--runtime-root", name, f"ROOT {quote_input(root)} is not an absolute path")
    for name in _duplicates([name for name, _ in plan.runtime_root]):
        raise _refuse("--runtime-root", name, "the same target named twice")


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
    """Apply the evidence to the base fleet (seed 004). ``now`` (timezone-aware) is this host's clock:
    failed collections and scheduler shapes are observed at ``now``.

    Order: runtime roots, capacity answers (``--capacity`` then ``--collect``), queue history,
    scheduler shapes. Targets without evidence keep their base record (their ``observed_at`` is not
    refreshed). The result is validated as ``vq.placement-fleet/1``. Call :func:`check_plan` first.
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
