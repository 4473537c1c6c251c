"""Explain one job's completion-time placement over a fleet (seed 004, "Hard requirements first" and
"Then rank by predicted completion").

:func:`explain_placement` is pure: the fleet, the request, ``now`` and ``max_age_seconds`` in, an
:class:`Explanation` out. No clock, no I/O; the same inputs always give the same explanation, and
:func:`render_text` / :func:`to_json` are deterministic, so the same files and ``--now`` give
byte-identical output.

Every target is checked against every hard requirement in :data:`REQUIREMENTS` (the seed's order); a
target failing any is rejected with *all* the reasons that apply, each a whole text
``<requirement>: <detail>``. The others are ranked by predicted completion::

    completion = staging + queue wait + execution + result transfer

each component an interval ``[low, high]`` in seconds with its source, or unknown with its reason.
Complete predictions rank first, then by completion midpoint, upper bound, the faster target (higher
``speed_factor``) and the name; a prediction with an unknown component ranks after them by the same keys
over its known part, and is shown as ``... + unknown``. With no eligible target the job is held.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from typing import Any

from app.errors import InvalidInput
from app.fleet.documents import FleetTarget, PlacementFleet, PlacementRequestDoc, dump_document, plain_number
from app.fleet.estimate import CalibratedEstimate, EstimateReport, FieldFill, apply_estimate

EXPLANATION_SCHEMA = "vq.placement-explanation/1"
DEFAULT_MAX_AGE_SECONDS = 300
CLOCK_SKEW_SECONDS = 60
COMPONENTS = ("staging", "queue_wait", "execution", "transfer")

ISA_ARCH_PREFIXES = (("x86-64", "x86_64"), ("aarch64", "aarch64"), ("armv8", "aarch64"), ("armv9", "aarch64"))
"""ISA level prefix -> the architecture it implies (decision written in docs/explain.md)."""
ARCH_ALIASES = {"amd64": "x86_64", "x86_64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}


@dataclass(frozen=True)
class Component:
    """One completion component: an interval ``[low, high]`` in seconds with its ``source`` (and an
    optional ``note``), or unknown (``low``/``high`` None) with its ``reason``."""

    name: str
    low: float | None = None
    high: float | None = None
    source: str | None = None
    note: str | None = None
    reason: str | None = None

    @property
    def known(self) -> bool:
        return self.low is not None and self.high is not None


@dataclass(frozen=True)
class Completion:
    """The predicted completion in seconds. ``complete``: every component known, and ``low``/``high``
    are the prediction. Otherwise ``low``/``high`` sum only the known components (never a prediction)
    and ``unknown`` names the rest."""

    complete: bool
    low: float
    high: float
    unknown: tuple[str, ...]

    @property
    def midpoint(self) -> float:
        return (self.low + self.high) / 2


@dataclass(frozen=True)
class Candidate:
    """An eligible target, ranked (1 = best): its runtime digest, data age (seconds), speed and the four
    components with their completion."""

    rank: int
    target: FleetTarget
    runtime_digest: str
    data_age_seconds: float
    components: tuple[Component, ...]
    completion: Completion


@dataclass(frozen=True)
class Rejection:
    """A target that fails one or more hard requirements, with every reason that applies (seed order)."""

    target: FleetTarget
    data_age_seconds: float | None
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Explanation:
    """The whole decision: the effective request (after any estimate), the estimate report, the ranked
    candidates, the rejections (fleet order), the selected candidate, or ``held`` with its reason."""

    now: datetime
    max_age_seconds: int
    request: PlacementRequestDoc
    estimate: EstimateReport | None
    candidates: tuple[Candidate, ...]
    rejected: tuple[Rejection, ...]
    held_reason: str | None

    @property
    def held(self) -> bool:
        return not self.candidates

    @property
    def selected(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None


@dataclass(frozen=True)
class _Context:
    now: datetime
    max_age_seconds: int
    age_seconds: float | None


# ---------------------------------------------------------------------------------------------------
# Formatting helpers (shared by reasons, text and JSON so that all three agree)


def _exact(value: float | int) -> Fraction:
    """A decimal figure as an exact fraction (``0.7`` is 7/10), so bounds compare without float noise:
    equality at the walltime bound fits."""
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def exceeds(runtime_high: float, speed_factor: float, bound: int) -> bool:
    """``runtime_high / speed_factor > bound``, exactly (equality fits): floats decide unless the two
    sides are within rounding of each other, and then exact decimal fractions do (``7 / 0.7 == 10``)."""
    upper = runtime_high / speed_factor
    if abs(upper - bound) > 1e-9 * max(1.0, abs(upper)):
        return upper > bound
    return _exact(runtime_high) / _exact(speed_factor) > bound


def _num(value: float | int) -> str:
    """A figure for people: integers plain, others with at most 3 decimals (``2.5``, ``0.333``)."""
    rounded = round(float(value), 3)
    if rounded.is_integer():
        return str(int(rounded))
    return f"{rounded:.3f}".rstrip("0").rstrip(".")


def _json_num(value: float | int | None) -> float | int | None:
    """A figure for JSON: rounded to 3 decimals, integral values as integers."""
    if value is None:
        return None
    return plain_number(round(float(value), 3))


def _labels(values: list[str] | tuple[str, ...]) -> str:
    return ", ".join(values) if values else "none"


# ---------------------------------------------------------------------------------------------------
# Hard requirements: one function per seed bullet, each returning every reason that applies.

Check = Callable[[FleetTarget, PlacementRequestDoc, _Context], list[str]]


def check_availability(target: FleetTarget, request: PlacementRequestDoc, ctx: _Context) -> list[str]:
    """Seed: "was unreachable or in maintenance when observed" (unknown reachability rejects)."""
    reasons = []
    if target.reachable is None:
        reasons.append("reachable: unknown")
    elif not target.reachable:
        reasons.append("reachable: unreachable when observed")
    if target.maintenance:
        reasons.append("maintenance: in maintenance when observed")
    return reasons


def check_freshness(target: FleetTarget, request: PlacementRequestDoc, ctx: _Context) -> list[str]:
    """Seed: "observed longer ago than --max-age (default 300 s), or more than 60 s in the future"."""
    if ctx.age_seconds is None:
        return ["freshness: observation time unknown"]
    if ctx.age_seconds > ctx.max_age_seconds:
        return [
            f"freshness: observed {_num(ctx.age_seconds)} s ago, "
            f"older than the max age of {ctx.max_age_seconds} s"
        ]
    if -ctx.age_seconds > CLOCK_SKEW_SECONDS:
        return [
            f"freshness: observed {_num(-ctx.age_seconds)} s in the future, "
            f"beyond the {CLOCK_SKEW_SECONDS} s clock-skew allowance"
        ]
    return []


def check_program(target: FleetTarget, request: PlacementRequestDoc, ctx: _Context) -> list[str]:
    """Seed: "lacks the program, or the requested runtime digest" (a digest is never substituted)."""
    digests = target.programs.get(request.program)
    if digests is None:
        return [f"program: lacks {request.program}"]
    if request.runtime_digest is not None and request.runtime_digest not in digests:
        return [f"runtime: lacks {request.program} runtime {request.runtime_digest}"]
    return []


def check_os(target: FleetTarget, request: PlacementRequestDoc, ctx: _Context) -> list[str]:
    """Seed: "has a different or unknown operating system when os is requested" (exact, case-sensitive)."""
    if request.os is None or target.os == request.os:
        return []
    return [f"os: {target.os or 'unknown'}, want {request.os}"]


def isa_arch(isa_level: str) -> str | None:
    """The architecture an ISA level implies (``x86-64-v4`` -> ``x86_64``), or None when unknown."""
    for prefix, arch in ISA_ARCH_PREFIXES:
        if isa_level.startswith(prefix):
            return arch
    return None


def check_isa(target: FleetTarget, request: PlacementRequestDoc, ctx: _Context) -> list[str]:
    """Seed: "has another architecture, or does not support the requested ISA level"."""
    if request.isa_level is None:
        return []
    reasons = []
    wanted_arch = isa_arch(request.isa_level)
    if wanted_arch is not None and target.arch is not None:
        if ARCH_ALIASES.get(target.arch, target.arch) != wanted_arch:
            reasons.append(f"arch: {target.arch} cannot run {request.isa_level} ({wanted_arch})")
    if target.isa_levels is None:
        reasons.append(f"isa: supported ISA levels unknown, want {request.isa_level}")
    elif request.isa_level not in target.isa_levels:
        reasons.append(f"isa: {request.isa_level} not supported (supports {_labels(target.isa_levels)})")
    return reasons


def check_account(target: FleetTarget, request: PlacementRequestDoc, ctx: _Context) -> list[str]:
    """Seed: "does not permit the requested account, or its permitted accounts are unknown"."""
    if request.account is None:
        return []
    if target.accounts is None:
        return [f"account: permitted accounts unknown, want {request.account}"]
    if request.account not in target.accounts:
        return [f"account: {request.account} not permitted (permits {_labels(target.accounts)})"]
    return []


def check_queue(target: FleetTarget, request: PlacementRequestDoc, ctx: _Context) -> list[str]:
    """Seed: "is a daemon host, or has a different or unknown queue/partition, when queue is requested"."""
    if request.queue is None:
        return []
    if target.kind == "daemon":
        return [f"queue: a daemon host has no queue, want {request.queue}"]
    if target.queue is None:
        return [f"queue: unknown, want {request.queue}"]
    if target.queue != request.queue:
        return [f"queue: {target.queue}, want {request.queue}"]
    return []


def _label_requirement(what: str, needed: list[str] | None, available: list[str] | None) -> list[str]:
    if not needed:
        return []
    if available is None:
        return [f"{what}: unknown, want {_labels(needed)}"]
    missing = [label for label in needed if label not in available]
    return [f"{what}: lacks {_labels(missing)}"] if missing else []


def check_data_access(target: FleetTarget, request: PlacementRequestDoc, ctx: _Context) -> list[str]:
    """Seed: "lacks any required data-access label, or its data access is unknown"."""
    return _label_requirement("data access", request.required_data_access, target.data_access)


def check_licenses(target: FleetTarget, request: PlacementRequestDoc, ctx: _Context) -> list[str]:
    """Seed: "lacks any required license-eligibility label, or its license eligibility is unknown"."""
    return _label_requirement("licenses", request.required_licenses, target.licenses)


def check_nodes(target: FleetTarget, request: PlacementRequestDoc, ctx: _Context) -> list[str]:
    """Seed: "needs more nodes than one job may have there". A daemon host is one node; a lane with no
    recorded ``max_nodes`` admits a one-node job only."""
    limit = target.job_max_nodes
    if request.nodes == 1:
        return []
    if limit is None:
        return [f"nodes: needs {request.nodes}, per-job node limit unknown"]
    if request.nodes > limit:
        return [f"nodes: needs {request.nodes}, a job may have at most {limit}"]
    return []


def _cpu_layout(request: PlacementRequestDoc) -> str:
    if request.mpi_ranks is not None and request.threads_per_rank is not None:
        return f"{request.mpi_ranks} ranks x {request.threads_per_rank} threads on {request.nodes} node(s)"
    return f"{request.cpus} CPUs on {request.nodes} node(s)"


def check_node_shape(target: FleetTarget, request: PlacementRequestDoc, ctx: _Context) -> list[str]:
    """Seed: "has nodes with too few CPUs for the whole-rank layout when declared (otherwise
    ceil(cpus / nodes)), or too little memory per node, or does not record that number when the request
    needs it"."""
    node = target.node
    reasons = []
    need = request.cpus_per_node
    cpus = node.cpus if node else None
    if cpus is None:
        reasons.append(f"cpus: needs {need} per node ({_cpu_layout(request)}), node CPUs unknown")
    elif cpus < need:
        reasons.append(f"cpus: needs {need} per node ({_cpu_layout(request)}), node has {cpus}")
    if request.mem_mb_per_node is not None:
        mem = node.mem_mb if node else None
        if mem is None:
            reasons.append(f"memory: needs {request.mem_mb_per_node} MB per node, node memory unknown")
        elif mem < request.mem_mb_per_node:
            reasons.append(f"memory: needs {request.mem_mb_per_node} MB per node, node has {mem} MB")
    return reasons


def check_scratch(target: FleetTarget, request: PlacementRequestDoc, ctx: _Context) -> list[str]:
    """Seed: "has too little scratch per node, or unknown scratch capacity when scratch_mb_per_node is
    requested" (nodes never combine scratch)."""
    need = request.scratch_mb_per_node
    if need is None:
        return []
    scratch = target.node.scratch_mb if target.node else None
    if scratch is None:
        return [f"scratch: needs {need} MB per node, node scratch unknown"]
    if scratch < need:
        return [f"scratch: needs {need} MB per node, node has {scratch} MB"]
    return []


def check_gpus(target: FleetTarget, request: PlacementRequestDoc, ctx: _Context) -> list[str]:
    """Seed: "has too few GPUs per node, or an unknown GPU count, when gpus_per_node is requested"."""
    need = request.gpus_per_node
    if need is None:
        return []
    gpus = target.node.gpus if target.node else None
    if gpus is None:
        return [f"gpus: needs {need} per node, node GPU count unknown"]
    if gpus < need:
        return [f"gpus: needs {need} per node, node has {gpus}"]
    return []


def check_walltime_limit(target: FleetTarget, request: PlacementRequestDoc, ctx: _Context) -> list[str]:
    """Seed: "cannot accept the explicit wall_time_seconds request, or has no known walltime limit and
    no positive evidence of unlimited walltime"."""
    if target.walltime_unlimited:
        return []
    limit = target.max_walltime_seconds
    if limit is None:
        return ["walltime: limit unknown and not recorded as unlimited"]
    if request.wall_time_seconds is not None and request.wall_time_seconds > limit:
        return [f"walltime: requests {request.wall_time_seconds} s, over the limit of {limit} s"]
    return []


def check_execution_bound(target: FleetTarget, request: PlacementRequestDoc, ctx: _Context) -> list[str]:
    """Seed: "would exceed either its own walltime limit or the job's requested wall_time_seconds at the
    upper end of the predicted execution time": ``runtime_seconds.high / speed_factor`` against both;
    equality fits. Without a runtime estimate there is nothing to check here."""
    if request.runtime_seconds is None:
        return []
    high, speed = request.runtime_seconds.high, target.speed_factor
    exceeded = []
    limit = target.max_walltime_seconds
    if not target.walltime_unlimited and limit is not None and exceeds(high, speed, limit):
        exceeded.append(f"the walltime limit of {limit} s")
    if request.wall_time_seconds is not None and exceeds(high, speed, request.wall_time_seconds):
        exceeded.append(f"the requested walltime of {request.wall_time_seconds} s")
    if not exceeded:
        return []
    shown = f"execution: up to {_num(high / speed)} s ({_num(high)} s at speed {_num(speed)})"
    return [f"{shown} exceeds {what}" for what in exceeded]


REQUIREMENTS: tuple[tuple[str, Check], ...] = (
    ("availability", check_availability),
    ("freshness", check_freshness),
    ("program", check_program),
    ("os", check_os),
    ("isa", check_isa),
    ("account", check_account),
    ("queue", check_queue),
    ("data_access", check_data_access),
    ("licenses", check_licenses),
    ("nodes", check_nodes),
    ("node_shape", check_node_shape),
    ("scratch", check_scratch),
    ("gpus", check_gpus),
    ("walltime_limit", check_walltime_limit),
    ("execution_bound", check_execution_bound),
)
"""The hard requirements in the seed's order; every one runs, and every reason is kept."""


# ---------------------------------------------------------------------------------------------------
# Completion components


def _transfer_component(name: str, mb: float | None, rate: float | None, what: str) -> Component:
    if not mb:
        return Component(name, 0.0, 0.0, source=f"no {what}")
    if rate is None:
        rate_field = "staging_mb_per_second" if name == "staging" else "transfer_mb_per_second"
        return Component(name, reason=f"{rate_field} unknown ({_num(mb)} MB of {what})")
    seconds = mb / rate
    return Component(name, seconds, seconds, source=f"{_num(mb)} MB at {_num(rate)} MB/s")


def free_now_shortfall(target: FleetTarget, request: PlacementRequestDoc) -> list[str]:
    """Why a daemon's free capacity does not fit the job now (empty: it fits). All requested CPUs on its
    one node, the memory, and any requested scratch and GPUs must fit; unknown free scratch or GPUs do
    not fit."""
    free = target.free
    if free is None:
        return ["no free capacity recorded"]
    short = []
    if free.cpus < request.cpus:
        short.append(f"cpus {free.cpus} free, {request.cpus} needed")
    if request.mem_mb_per_node is not None and free.mem_mb < request.mem_mb_per_node:
        short.append(f"memory {free.mem_mb} MB free, {request.mem_mb_per_node} MB needed")
    if request.scratch_mb_per_node is not None:
        if free.scratch_mb is None:
            short.append("free scratch unknown")
        elif free.scratch_mb < request.scratch_mb_per_node:
            short.append(f"scratch {free.scratch_mb} MB free, {request.scratch_mb_per_node} MB needed")
    if request.gpus_per_node is not None:
        if free.gpus is None:
            short.append("free GPUs unknown")
        elif free.gpus < request.gpus_per_node:
            short.append(f"gpus {free.gpus} free, {request.gpus_per_node} needed")
    return short


def _queue_wait_component(target: FleetTarget, request: PlacementRequestDoc) -> Component:
    note = None
    if target.kind == "daemon":
        short = free_now_shortfall(target, request)
        if not short:
            return Component("queue_wait", 0.0, 0.0, source="free now")
        note = "not free now: " + "; ".join(short)
    wait = target.queue_wait_seconds
    if wait is None:
        reason = "no queue-wait estimate" if note is None else f"{note}; no queue-wait estimate"
        return Component("queue_wait", reason=reason)
    return Component("queue_wait", float(wait.low), float(wait.high), source=wait.source, note=note)


def _execution_component(
    target: FleetTarget, request: PlacementRequestDoc, estimate: EstimateReport | None
) -> Component:
    runtime = request.runtime_seconds
    if runtime is None:
        reason = "no runtime estimate"
        fill = _fill_for(estimate, "runtime_seconds")
        if fill is not None and fill.reason:
            reason = f"no runtime estimate ({fill.reason})"
        return Component("execution", reason=reason)
    low = runtime.low / target.speed_factor
    high = runtime.high / target.speed_factor
    source = (
        f"runtime {_interval_text(runtime.low, runtime.high)} s / speed {_num(target.speed_factor)} "
        f"({target.speed_source})"
    )
    return Component("execution", low, high, source=source)


def _fill_for(estimate: EstimateReport | None, field: str) -> FieldFill | None:
    if estimate is None:
        return None
    return next((fill for fill in estimate.fields if fill.field == field), None)


def components_for(
    target: FleetTarget, request: PlacementRequestDoc, estimate: EstimateReport | None = None
) -> tuple[Component, ...]:
    """The four completion components for an eligible target, in order staging, queue_wait, execution,
    transfer (seed 004's table): staging ``input_mb / staging_mb_per_second`` (0 with no input), queue
    wait 0 for a daemon free now else ``queue_wait_seconds``, execution ``runtime_seconds /
    speed_factor``, transfer ``output_mb / transfer_mb_per_second`` (0 with no output). Seconds."""
    return (
        _transfer_component("staging", request.input_mb, target.staging_mb_per_second, "input"),
        _queue_wait_component(target, request),
        _execution_component(target, request, estimate),
        _transfer_component("transfer", request.output_mb, target.transfer_mb_per_second, "output"),
    )


def completion_of(components: tuple[Component, ...]) -> Completion:
    """Sum the components: complete when all are known; else the known part and the unknown names."""
    known = [c for c in components if c.known]
    low = math.fsum(c.low for c in known if c.low is not None)
    high = math.fsum(c.high for c in known if c.high is not None)
    unknown = tuple(c.name for c in components if not c.known)
    return Completion(complete=not unknown, low=low, high=high, unknown=unknown)


def ranking_key(target: FleetTarget, completion: Completion) -> tuple[Any, ...]:
    """Seed: complete predictions first, then completion midpoint, upper bound, the faster target, the
    name. Incomplete ones follow, ordered by the same keys over their known part."""
    return (
        0 if completion.complete else 1,
        completion.low + completion.high,
        completion.high,
        -target.speed_factor,
        target.name,
    )


# ---------------------------------------------------------------------------------------------------
# The explanation


def explain_placement(
    fleet: PlacementFleet,
    request: PlacementRequestDoc,
    now: datetime,
    max_age_seconds: int = DEFAULT_MAX_AGE_SECONDS,
    estimate: CalibratedEstimate | None = None,
) -> Explanation:
    """Apply seed 004's completion-time placement policy to one job.

    ``now`` (timezone-aware) dates every observation: data age = ``now - observed_at`` in seconds;
    older than ``max_age_seconds`` (equality fits) or more than 60 s in the future rejects. With
    ``estimate`` (a validated ``vq.calibrated-estimate/1``), unset ``runtime_seconds`` and
    ``mem_mb_per_node`` are filled first and the explanation carries the estimate report.

    Returns the :class:`Explanation`: candidates ranked (complete first, then midpoint, upper bound,
    faster, name), every rejected target with all its reasons, and ``held`` with a reason when nothing
    is eligible. Raises :class:`InvalidInput` for a naive ``now``, a negative ``max_age_seconds`` or an
    estimate for another program.
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise InvalidInput("now: must carry a UTC offset, e.g. 2026-10-12T12:00:00+00:00", path="now")
    if isinstance(max_age_seconds, bool) or not isinstance(max_age_seconds, int) or max_age_seconds < 0:
        raise InvalidInput("max_age: must be a whole number of seconds, 0 or more", path="max_age")
    report = None
    if estimate is not None:
        request, report = apply_estimate(request, estimate)

    ranked: list[tuple[tuple[Any, ...], FleetTarget, str, float, tuple[Component, ...], Completion]] = []
    rejected: list[Rejection] = []
    for target in fleet.targets:
        age = (now - target.observed_at).total_seconds() if target.observed_at is not None else None
        ctx = _Context(now=now, max_age_seconds=max_age_seconds, age_seconds=age)
        reasons = [reason for _, check in REQUIREMENTS for reason in check(target, request, ctx)]
        if reasons or age is None:
            rejected.append(Rejection(target=target, data_age_seconds=age, reasons=tuple(reasons)))
            continue
        components = components_for(target, request, report)
        completion = completion_of(components)
        digest = request.runtime_digest or target.programs[request.program][0]
        ranked.append((ranking_key(target, completion), target, digest, age, components, completion))

    ranked.sort(key=lambda item: item[0])
    candidates = tuple(
        Candidate(
            rank=index + 1,
            target=target,
            runtime_digest=digest,
            data_age_seconds=age,
            components=components,
            completion=completion,
        )
        for index, (_, target, digest, age, components, completion) in enumerate(ranked)
    )
    held_reason = None
    if not candidates:
        held_reason = (
            "the fleet has no targets"
            if not fleet.targets
            else f"no eligible target: {len(rejected)} of {len(fleet.targets)} rejected"
        )
    return Explanation(
        now=now,
        max_age_seconds=max_age_seconds,
        request=request,
        estimate=report,
        candidates=candidates,
        rejected=tuple(rejected),
        held_reason=held_reason,
    )


# ---------------------------------------------------------------------------------------------------
# Output: vq.placement-explanation/1 JSON and text


def _interval_text(low: float, high: float) -> str:
    return f"{_num(low)}" if _num(low) == _num(high) else f"{_num(low)}-{_num(high)}"


def _component_json(component: Component) -> dict[str, Any]:
    if not component.known:
        return {"known": False, "reason": component.reason}
    body: dict[str, Any] = {
        "known": True,
        "low": _json_num(component.low),
        "high": _json_num(component.high),
        "source": component.source,
    }
    if component.note is not None:
        body["note"] = component.note
    return body


def _completion_json(completion: Completion) -> dict[str, Any]:
    if completion.complete:
        return {
            "complete": True,
            "low": _json_num(completion.low),
            "high": _json_num(completion.high),
            "midpoint": _json_num(completion.midpoint),
        }
    return {
        "complete": False,
        "known_low": _json_num(completion.low),
        "known_high": _json_num(completion.high),
        "unknown": list(completion.unknown),
    }


def _estimate_json(report: EstimateReport) -> dict[str, Any]:
    fields = []
    for fill in report.fields:
        body: dict[str, Any] = {"field": fill.field, "outcome": fill.outcome}
        if fill.value is not None:
            body["value"] = (
                fill.value if isinstance(fill.value, int) else dump_document(fill.value)  # RuntimeRange
            )
        if fill.reason is not None:
            body["reason"] = fill.reason
        fields.append(body)
    return {
        "estimate_digest": report.estimate_digest,
        "calibration_id": report.calibration_id,
        "hardware_class": report.hardware_class,
        "fields": fields,
    }


def to_json(explanation: Explanation) -> dict[str, Any]:
    """The explanation as ``vq.placement-explanation/1`` (``openapi/vq.placement-explanation-1.schema.json``):
    ``{schema_name, now, max_age_seconds, request, estimate?, held, held_reason, selected, candidates,
    rejected}``. Seconds throughout, rounded to 3 decimals; deterministic key order."""
    selected = explanation.selected
    body: dict[str, Any] = {
        "schema_name": EXPLANATION_SCHEMA,
        "now": explanation.now.isoformat(),
        "max_age_seconds": explanation.max_age_seconds,
        "request": dump_document(explanation.request),
    }
    if explanation.estimate is not None:
        body["estimate"] = _estimate_json(explanation.estimate)
    body["held"] = explanation.held
    body["held_reason"] = explanation.held_reason
    body["selected"] = (
        None
        if selected is None
        else {"target": selected.target.name, "runtime_digest": selected.runtime_digest}
    )
    body["candidates"] = [
        {
            "rank": candidate.rank,
            "target": candidate.target.name,
            "kind": candidate.target.kind,
            "runtime_digest": candidate.runtime_digest,
            "observed_at": _observed(candidate.target),
            "data_age_seconds": _json_num(candidate.data_age_seconds),
            "speed_factor": _json_num(candidate.target.speed_factor),
            "speed_source": candidate.target.speed_source,
            "components": {component.name: _component_json(component) for component in candidate.components},
            "completion": _completion_json(candidate.completion),
        }
        for candidate in explanation.candidates
    ]
    body["rejected"] = [
        {
            "target": rejection.target.name,
            "kind": rejection.target.kind,
            "observed_at": _observed(rejection.target),
            "data_age_seconds": _json_num(rejection.data_age_seconds),
            "reasons": list(rejection.reasons),
        }
        for rejection in explanation.rejected
    ]
    return body


def _observed(target: FleetTarget) -> str | None:
    return target.observed_at.isoformat() if target.observed_at is not None else None


def _age_text(age: float | None) -> str:
    if age is None:
        return "data age unknown"
    if age < 0:
        return f"observed {_num(-age)} s in the future"
    return f"data age {_num(age)} s"


def _request_lines(request: PlacementRequestDoc) -> list[str]:
    runtime = request.runtime_digest or "any (each target's current runtime)"
    first = [f"program {request.program}, runtime digest {runtime}"]
    for label, value in (
        ("os", request.os),
        ("ISA", request.isa_level),
        ("account", request.account),
        ("queue", request.queue),
    ):
        if value is not None:
            first.append(f"{label} {value}")
    shape = [f"{request.cpus} CPUs on {request.nodes} node(s)"]
    if request.mpi_ranks is not None and request.threads_per_rank is not None:
        shape.append(f"{request.mpi_ranks} ranks x {request.threads_per_rank} threads")
    shape.append(f"{request.cpus_per_node} CPUs per node")
    if request.mem_mb_per_node is not None:
        shape.append(f"memory {request.mem_mb_per_node} MB per node")
    if request.scratch_mb_per_node is not None:
        shape.append(f"scratch {request.scratch_mb_per_node} MB per node")
    if request.gpus_per_node is not None:
        shape.append(f"{request.gpus_per_node} GPUs per node")
    lines = ["Request: " + ", ".join(first), "  " + ", ".join(shape)]
    needs = []
    if request.required_data_access:
        needs.append(f"data access {_labels(request.required_data_access)}")
    if request.required_licenses:
        needs.append(f"licenses {_labels(request.required_licenses)}")
    if needs:
        lines.append("  requires " + "; ".join(needs))
    time = []
    time.append(
        f"wall time {request.wall_time_seconds} s requested"
        if request.wall_time_seconds is not None
        else "no wall time requested"
    )
    time.append(
        f"runtime {_interval_text(request.runtime_seconds.low, request.runtime_seconds.high)} s at speed 1"
        if request.runtime_seconds is not None
        else "runtime unknown"
    )
    time.append(f"input {_num(request.input_mb or 0)} MB, output {_num(request.output_mb or 0)} MB")
    lines.append("  " + "; ".join(time))
    return lines


def _estimate_lines(report: EstimateReport) -> list[str]:
    lines = [
        f"Estimate: digest {report.estimate_digest}, calibration {report.calibration_id}, "
        f"hardware class {report.hardware_class}"
    ]
    for fill in report.fields:
        if fill.outcome == "not filled":
            lines.append(f"  {fill.field}: not filled: {fill.reason}")
            continue
        value = fill.value
        shown = f"{value} MB" if isinstance(value, int) else f"{_interval_text(value.low, value.high)} s"
        lines.append(f"  {fill.field}: {fill.outcome} ({shown})")
    return lines


COMPONENT_LABELS = {
    "staging": "staging",
    "queue_wait": "queue wait",
    "execution": "execution",
    "transfer": "transfer",
}


def _candidate_lines(candidate: Candidate) -> list[str]:
    target = candidate.target
    lines = [
        f"  {candidate.rank}. {target.name} ({target.kind}, {_age_text(candidate.data_age_seconds)}, "
        f"runtime digest {candidate.runtime_digest})"
    ]
    for component in candidate.components:
        label = COMPONENT_LABELS[component.name]
        if component.known and component.low is not None and component.high is not None:
            detail = component.source or ""
            if component.note:
                detail += f"; {component.note}"
            lines.append(
                f"       {label:<11} {_interval_text(component.low, component.high) + ' s':<18} {detail}"
            )
        else:
            lines.append(f"       {label:<11} {'unknown':<18} {component.reason}")
    completion = candidate.completion
    if completion.complete:
        total = (
            f"{_interval_text(completion.low, completion.high)} s (midpoint {_num(completion.midpoint)} s)"
        )
    else:
        known = _interval_text(completion.low, completion.high)
        total = f"{known} s + unknown ({', '.join(COMPONENT_LABELS[n] for n in completion.unknown)})"
    lines.append(f"       {'completion':<11} {total}")
    return lines


def render_text(explanation: Explanation) -> str:
    """The explanation for people: the request, the estimate section (when given), the selected target
    and runtime digest or the hold, each candidate (rank, data age, the four components with sources,
    completion) and each rejected target with every reason. Ends with a newline; deterministic."""
    lines = [
        f"Placement explanation at {explanation.now.isoformat()} (max age {explanation.max_age_seconds} s)",
        *_request_lines(explanation.request),
    ]
    if explanation.estimate is not None:
        lines.extend(_estimate_lines(explanation.estimate))
    lines.append("")
    selected = explanation.selected
    if selected is None:
        lines.append(f"Held: {explanation.held_reason}")
    else:
        lines.append(f"Selected: {selected.target.name}, runtime digest {selected.runtime_digest}")
    lines.append("")
    lines.append(f"Candidates ({len(explanation.candidates)}, ranked by predicted completion):")
    if not explanation.candidates:
        lines.append("  none")
    for candidate in explanation.candidates:
        lines.extend(_candidate_lines(candidate))
    lines.append("")
    lines.append(f"Rejected ({len(explanation.rejected)}):")
    if not explanation.rejected:
        lines.append("  none")
    for rejection in explanation.rejected:
        lines.append(
            f"  {rejection.target.name} ({rejection.target.kind}, {_age_text(rejection.data_age_seconds)})"
        )
        lines.extend(f"    - {reason}" for reason in rejection.reasons)
    return "\n".join(lines) + "\n"


def explain_documents(
    fleet: Any,
    request: Any,
    now: datetime,
    max_age_seconds: int = DEFAULT_MAX_AGE_SECONDS,
    estimate: Any = None,
) -> dict[str, Any]:
    """Explain from parsed JSON documents (the HTTP body's ``fleet``, ``request``, ``estimate``) to the
    ``vq.placement-explanation/1`` object. Raises :class:`InvalidInput` whose path is prefixed with the
    document, e.g. ``fleet.targets.3.node.cpus``."""
    from app.fleet.documents import load_fleet, load_request
    from app.fleet.estimate import check_estimate_program, load_estimate

    loaded: dict[str, Any] = {}
    loaders: list[tuple[str, Any, Callable[[Any], Any]]] = [
        ("fleet", fleet, load_fleet),
        ("request", request, load_request),
    ]
    if estimate is not None:
        loaders.append(("estimate", estimate, load_estimate))
    for what, data, loader in loaders:
        try:
            loaded[what] = loader(data)
        except InvalidInput as error:
            path = f"{what}.{error.path}" if error.path else what
            details = {**error.details, "path": path}
            raise InvalidInput(error.message, path=path, details=details) from None
    if "estimate" in loaded:
        try:
            check_estimate_program(loaded["request"], loaded["estimate"])
        except InvalidInput as error:
            raise InvalidInput(error.message, path="estimate.program") from None
    explanation = explain_placement(
        loaded["fleet"],
        loaded["request"],
        now,
        max_age_seconds=max_age_seconds,
        estimate=loaded.get("estimate"),
    )
    return to_json(explanation)
