"""The predicted completion of an eligible target (docs/explain.md)::

    completion = staging + queue wait + execution + result transfer

Each component is an interval ``[low, high]`` in seconds with its source, or unknown with its reason.
:func:`components_for` makes the four, :func:`completion_of` sums them. Also the explanation's value
types (:class:`Candidate`, :class:`Rejection`, :class:`Explanation`), which :mod:`app.fleet.explain`
makes and :mod:`app.fleet.render` prints. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from app.fleet.documents import FleetTarget, PlacementRequestDoc
from app.fleet.estimate import EstimateReport, FieldFill
from app.fleet.figures import interval_text, num_text

COMPONENTS = ("staging", "queue_wait", "execution", "transfer")


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


def _transfer_component(name: str, mb: float | None, rate: float | None, what: str) -> Component:
    if not mb:
        return Component(name, 0.0, 0.0, source=f"no {what}")
    if rate is None:
        rate_field = "staging_mb_per_second" if name == "staging" else "transfer_mb_per_second"
        return Component(name, reason=f"{rate_field} unknown ({num_text(mb)} MB of {what})")
    seconds = mb / rate
    return Component(name, seconds, seconds, source=f"{num_text(mb)} MB at {num_text(rate)} MB/s")


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


def _fill_for(estimate: EstimateReport | None, field: str) -> FieldFill | None:
    if estimate is None:
        return None
    return next((fill for fill in estimate.fields if fill.field == field), None)


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
        f"runtime {interval_text(runtime.low, runtime.high)} s / speed {num_text(target.speed_factor)} "
        f"({target.speed_source})"
    )
    return Component("execution", low, high, source=source)


def components_for(
    target: FleetTarget, request: PlacementRequestDoc, estimate: EstimateReport | None = None
) -> tuple[Component, ...]:
    """The four completion components for an eligible target, in order staging, queue_wait, execution,
    transfer (docs/explain.md's table): staging ``input_mb / staging_mb_per_second`` (0 with no input), queue
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
