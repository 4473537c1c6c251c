"""Compare the broker's two orderings on recorded jobs (docs/fleet.md).

Pure and read-only: the fleet, the job records and ``now`` in; places nothing.

Jobs: the ``jobs`` most recent finished local jobs (``kind: local``, state ``succeeded`` or ``failed``,
ordered by ``finished_at``, newest first; ties by ``job_id``). Scheduler jobs are left out before the
count. A job without a declared ``mem_mb``, ``cpus`` or ``program`` is skipped and counted.

Snapshot: one per daemon target of the fleet: its free CPUs and memory (a missing ``free`` is unknown),
its observation time, its walltime limit, reachability and maintenance (closed).

1. Capacity ordering (the broker's admission and ranking, B2). Admission blockers, all that apply, in
   this order: ``unreachable``; ``closed``; ``stale: observed <age> s ago, max <max> s`` / ``observed
   <s> s in the future`` / ``no observation time``; ``program <p> not installed``; ``free capacity
   unknown``; ``cpus: <free> free, <n> needed``; ``memory: <free> MB free, <n> MB needed``; ``walltime:
   <n> s requested, limit <l> s`` / ``walltime: <n> s requested, limit unknown``. Ranking of the admitted:
   most CPUs left free after placing the job, then most memory left free, then the name.
2. Completion-time ordering: the re-ranker of ``placement explain`` applied to that decision: the
   admitted targets in ``explain_placement``'s order for the job (as a ``vq.placement-request/1`` with
   its program, cpus, one node, ``mem_mb_per_node`` and ``wall_time_seconds``); an admitted target that
   explain rejects is blocked with explain's reasons.

Totals: ``compared`` = ``same`` + ``different`` + ``held_by_either``; ``skipped`` counted apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.errors import InvalidInput, errors_under
from app.fleet.documents import FleetTarget, PlacementFleet, load_request
from app.fleet.explain import explain_placement
from app.fleet.history import JobRecord, parse_time
from app.fleet.requirements.freshness import CLOCK_SKEW_SECONDS, DEFAULT_MAX_AGE_SECONDS

COMPARE_SCHEMA = "vq.placement-compare/1"
DEFAULT_COMPARE_JOBS = 50
FINISHED_STATES = ("succeeded", "failed")


@dataclass(frozen=True)
class OrderingChoice:
    """One ordering's decision for a job: the chosen target (``None`` = held) and, per target not
    chosen for a reason, its blockers."""

    choice: str | None
    blockers: dict[str, list[str]]

    def to_json(self) -> dict[str, Any]:
        """``{choice, held, blockers: {target: [reason]}}``."""
        return {"choice": self.choice, "held": self.choice is None, "blockers": self.blockers}


@dataclass(frozen=True)
class JobComparison:
    """A compared job: its figures and both orderings' choices; ``differ`` when the choices differ."""

    job: JobRecord
    capacity: OrderingChoice
    completion_time: OrderingChoice

    @property
    def differ(self) -> bool:
        return self.capacity.choice != self.completion_time.choice

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job.job_id,
            "program": self.job.program,
            "cpus": self.job.cpus,
            "mem_mb": self.job.mem_mb,
            "wall_time_seconds": self.job.wall_time_seconds,
            "capacity": self.capacity.to_json(),
            "completion_time": self.completion_time.to_json(),
            "differ": self.differ,
        }


@dataclass(frozen=True)
class Comparison:
    """The whole report: compared jobs (newest first), skipped jobs with reasons, and the totals."""

    now: datetime
    max_age_seconds: int
    jobs: tuple[JobComparison, ...]
    skipped: tuple[tuple[str, str], ...]

    @property
    def totals(self) -> dict[str, int]:
        held = sum(1 for j in self.jobs if j.capacity.choice is None or j.completion_time.choice is None)
        same = sum(
            1
            for j in self.jobs
            if j.capacity.choice is not None and j.capacity.choice == j.completion_time.choice
        )
        return {
            "compared": len(self.jobs),
            "same": same,
            "different": len(self.jobs) - same - held,
            "held_by_either": held,
            "skipped": len(self.skipped),
        }

    def to_json(self) -> dict[str, Any]:
        """``vq.placement-compare/1`` (defined in docs/fleet.md)."""
        return {
            "schema_name": COMPARE_SCHEMA,
            "now": self.now.isoformat(),
            "max_age_seconds": self.max_age_seconds,
            "totals": self.totals,
            "jobs": [job.to_json() for job in self.jobs],
            "skipped": [{"job_id": job_id, "reason": reason} for job_id, reason in self.skipped],
        }


def recent_finished_local_jobs(records: list[JobRecord], count: int) -> list[JobRecord]:
    """The ``count`` most recent finished local jobs, newest first (scheduler jobs left out; a job
    without a parseable ``finished_at`` is not finished)."""
    finished = [
        (parse_time(r.finished_at), r.job_id, r)
        for r in records
        if r.kind == "local" and r.state in FINISHED_STATES and parse_time(r.finished_at) is not None
    ]
    finished.sort(key=lambda item: (item[0], item[1]), reverse=True)
    return [record for _, _, record in finished[:count]]


def admission_blockers(target: FleetTarget, job: JobRecord, now: datetime, max_age_seconds: int) -> list[str]:
    """Why the broker's capacity admission (B2) refuses ``job`` on daemon ``target`` (empty: admitted)."""
    blockers: list[str] = []
    if target.reachable is not True:
        blockers.append("unreachable")
    if target.maintenance:
        blockers.append("closed")
    if target.observed_at is None:
        blockers.append("no observation time")
    else:
        age = (now - target.observed_at).total_seconds()
        if age > max_age_seconds:
            blockers.append(f"stale: observed {age:g} s ago, max {max_age_seconds} s")
        elif -age > CLOCK_SKEW_SECONDS:
            blockers.append(f"observed {-age:g} s in the future")
    if job.program not in target.programs:
        blockers.append(f"program {job.program} not installed")
    if target.free is None:
        blockers.append("free capacity unknown")
    else:
        if job.cpus is not None and target.free.cpus < job.cpus:
            blockers.append(f"cpus: {target.free.cpus} free, {job.cpus} needed")
        if job.mem_mb is not None and target.free.mem_mb < job.mem_mb:
            blockers.append(f"memory: {target.free.mem_mb} MB free, {job.mem_mb} MB needed")
    if job.wall_time_seconds is not None and not target.walltime_unlimited:
        if target.max_walltime_seconds is None:
            blockers.append(f"walltime: {job.wall_time_seconds} s requested, limit unknown")
        elif job.wall_time_seconds > target.max_walltime_seconds:
            blockers.append(
                f"walltime: {job.wall_time_seconds} s requested, limit {target.max_walltime_seconds} s"
            )
    return blockers


def _capacity_key(target: FleetTarget, job: JobRecord) -> tuple[int, int, str]:
    assert target.free is not None
    return (-(target.free.cpus - (job.cpus or 0)), -(target.free.mem_mb - (job.mem_mb or 0)), target.name)


def compare_orderings(
    fleet: PlacementFleet,
    records: list[JobRecord],
    now: datetime,
    *,
    jobs: int = DEFAULT_COMPARE_JOBS,
    max_age_seconds: int = DEFAULT_MAX_AGE_SECONDS,
) -> Comparison:
    """Place each recent finished local job twice over the fleet's daemon snapshot (see the module
    doc) and report both choices, whether they differ, their blockers and the totals. ``now`` is
    timezone-aware; ``max_age_seconds`` as for explain (default 300)."""
    if now.tzinfo is None or now.utcoffset() is None:
        raise InvalidInput("now: must carry a UTC offset", path="now")
    daemons = [target for target in fleet.targets if target.kind == "daemon"]
    snapshot = PlacementFleet(schema_name="vq.placement-fleet/1", targets=daemons)
    compared: list[JobComparison] = []
    skipped: list[tuple[str, str]] = []
    for job in recent_finished_local_jobs(records, jobs):
        if job.mem_mb is None:
            skipped.append((job.job_id, "no declared --mem-mb"))
            continue
        if job.cpus is None or job.program is None:
            skipped.append((job.job_id, "no cpus or program recorded"))
            continue
        request_doc: dict[str, Any] = {
            "schema_name": "vq.placement-request/1",
            "program": job.program,
            "cpus": job.cpus,
            "nodes": 1,
            "mem_mb_per_node": job.mem_mb,
        }
        if job.wall_time_seconds is not None:
            request_doc["wall_time_seconds"] = job.wall_time_seconds
        try:
            request = load_request(request_doc)
        except InvalidInput as error:
            skipped.append((job.job_id, f"not a placement request: {error.message}"))
            continue

        blockers: dict[str, list[str]] = {}
        admitted: list[FleetTarget] = []
        for target in daemons:
            reasons = admission_blockers(target, job, now, max_age_seconds)
            if reasons:
                blockers[target.name] = reasons
            else:
                admitted.append(target)
        admitted.sort(key=lambda target: _capacity_key(target, job))
        capacity = OrderingChoice(admitted[0].name if admitted else None, blockers)

        explanation = explain_placement(snapshot, request, now, max_age_seconds=max_age_seconds)
        admitted_names = {target.name for target in admitted}
        completion_blockers = {name: list(reasons) for name, reasons in blockers.items()}
        for rejection in explanation.rejected:
            if rejection.target.name in admitted_names:
                completion_blockers[rejection.target.name] = list(rejection.reasons)
        ranked = [c.target.name for c in explanation.candidates if c.target.name in admitted_names]
        completion = OrderingChoice(ranked[0] if ranked else None, completion_blockers)
        compared.append(JobComparison(job, capacity, completion))
    return Comparison(now=now, max_age_seconds=max_age_seconds, jobs=tuple(compared), skipped=tuple(skipped))


def render_text(comparison: Comparison) -> str:
    """The report for people: one line per job, then the totals."""
    lines = []
    for item in comparison.jobs:
        cap = item.capacity.choice or "held"
        ct = item.completion_time.choice or "held"
        mark = "differ" if item.differ else "same"
        lines.append(f"{item.job.job_id}: capacity -> {cap}, completion-time -> {ct} ({mark})")
        for label, ordering in (("capacity", item.capacity), ("completion-time", item.completion_time)):
            for name, reasons in ordering.blockers.items():
                lines.append(f"    {label} blocked {name}: {'; '.join(reasons)}")
    for job_id, reason in comparison.skipped:
        lines.append(f"{job_id}: skipped ({reason})")
    totals = comparison.totals
    lines.append(
        f"compared {totals['compared']}: same {totals['same']}, different {totals['different']}, "
        f"held by either {totals['held_by_either']}; skipped {totals['skipped']}"
    )
    return "\n".join(lines) + "\n"


def compare_documents(
    fleet: Any,
    history: Any,
    now: datetime,
    *,
    jobs: int = DEFAULT_COMPARE_JOBS,
    max_age_seconds: int = DEFAULT_MAX_AGE_SECONDS,
) -> dict[str, Any]:
    """The HTTP face: a parsed fleet and ``vq.job-history/1`` to ``vq.placement-compare/1``. Raises
    :class:`InvalidInput` whose path names the body field (``fleet.targets.0.kind``, ``history.jobs.3``)."""
    from app.fleet.documents import load_fleet
    from app.fleet.history import load_job_history

    with errors_under("fleet"):
        fleet_doc = load_fleet(fleet)
    with errors_under("history"):
        history_doc = load_job_history(history)
    comparison = compare_orderings(
        fleet_doc, list(history_doc.jobs), now, jobs=jobs, max_age_seconds=max_age_seconds
    )
    return comparison.to_json()
