"""Every Prometheus metric of the service, in one module (served at ``/metrics``; docs/metrics.md).

Modelled on kube-scheduler's stable set (``scheduler_schedule_attempts_total{result, profile}``,
``scheduler_scheduling_attempt_duration_seconds``) and Prometheus naming: base units (seconds), ``_total``
on counters, a ``_info`` gauge of 1 for the build. Labels are bounded: pool ids and device classes may
appear, tenant ids, reservation ids, node names and free texts never. Every label set that is known in
advance is created at zero when this module is imported, so ``rate()`` and ``absent()`` work before the
first event; the ``_created`` series (timestamps that look like counts) are switched off here, before any
metric exists.

``bc_reservations`` and ``bc_atoms`` describe the fleet now, not this process: they are counted in
PostgreSQL (:mod:`app.capacity.controllers.census`) when ``/metrics`` is served, at most once per
``BC_METRICS_GAUGE_TTL_SECONDS``, and every replica reports the same values.

With ``serve --workers N`` one scrape reports every worker: counters and histograms summed, gauges merged
as their ``multiprocess_mode`` says (every ``Gauge`` here names one), the build info and the fleet gauges
once (:mod:`app.observability.multiprocess`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import ParamSpec, TypeVar

import prometheus_client
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, Info
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.commit.lost_races import LOST_RACE_KINDS
from app.capacity.conditions import DEADLINE_PASSED, WINDOW_ENDED, WINDOW_PASSED
from app.capacity.controllers import census
from app.errors import AppError
from app.observability.multiprocess import merged_registry

prometheus_client.disable_created_metrics()  # before the first metric: no ``*_created`` series at all

log = logging.getLogger("better_compute.metrics")

# 1 ms .. 16.384 s, doubling (prometheus_client's exponential buckets: start 0.001, factor 2, count 15)
DURATION_BUCKETS = tuple(0.001 * 2**i for i in range(15))
PLACEMENT_RESULTS = ("placed", "pending", "error")
PLACERS = ("inline", "wake", "pool-lease", "bulk")  # wake: the inline placer run by the wake-edge controller
PLAN_PATHS = ("shortlist", "exceptions", "full")
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER_METHOD = "other"  # any other method a client sends (a bounded label)
UNMATCHED_ROUTE = "unmatched"  # a path no route matches (never the raw path)
GAUGE_READ_TIMEOUT = 5.0  # seconds: a scrape that cannot count in time serves the other metrics

BATCH_SOURCES = ("pool-lease", "bulk")  # who formed a batch: the queue worker, or POST /v1/reservations/batch
# 1, 2, 4, ... 256 reservations
BATCH_SIZE_BUCKETS = tuple(float(2**i) for i in range(9))
PLACEMENT_BATCH_SIZE = Histogram(
    "bc_placement_batch_size",
    "Reservations planned and committed together in one batch transaction, by source: pool-lease (the "
    "queue worker) or bulk (POST /v1/reservations/batch).",
    ["source"],
    buckets=BATCH_SIZE_BUCKETS,
)
QUEUED_WAIT = Histogram(
    "bc_queued_wait_seconds",
    "How long a queued reservation waited, from its creation to the batch that decided it (seconds).",
    buckets=DURATION_BUCKETS,
)
QUEUED_DECIDED = Counter(
    "bc_queued_decided_total",
    "Queued reservations a batch worker decided, by result: placed or pending.",
    ["result"],
)
PLACEMENT_ATTEMPTS = Counter(
    "bc_placement_attempts_total",
    "Placement attempts (plan and commit of one reservation), by result: placed, pending (nothing fits, "
    "or every commit lost its race) or error (an internal error). A refusal (over quota) is no result.",
    ["result", "placer"],
)
PLACEMENT_ATTEMPT_DURATION = Histogram(
    "bc_placement_attempt_duration_seconds",
    "Duration of a whole placement attempt: every plan and guarded commit, lost races included (seconds).",
    ["result"],
    buckets=DURATION_BUCKETS,
)
PLAN_DURATION = Histogram(
    "bc_plan_duration_seconds",
    "Duration of one plan: snapshot reads and the placement pipeline, no commit (seconds).",
    buckets=DURATION_BUCKETS,
)
PLANS = Counter(
    "bc_plans_total",
    "Plans made, by path: the shortlist, the whole pool on the shortlist's exceptions (nothing fits), or the "
    "whole pool read.",
    ["path"],
)
LOST_RACES = Counter(
    "bc_lost_races_total",
    "Guarded commits that lost a race and replanned, by reason: not_schedulable, atom_unhealthy, "
    "atom_booked, scalar_ran_out.",
    ["reason"],
)
QUOTA_REJECTIONS = Counter(
    "bc_quota_rejections_total", "Requests refused because a tenant's quota would be exceeded (409)."
)
AUDIT_EVENTS = Counter(
    "bc_audit_events_total",
    'Audit rows recorded for mutating requests (docs/operating.md, "Audit log"), by the answer\'s '
    "status class: 2xx, 3xx, 4xx, 5xx.",
    ["outcome"],
)
AUDIT_WRITE_FAILURES = Counter(
    "bc_audit_write_failures_total",
    "Audit rows the service could not write after the answer (the database did not take them).",
)
HTTP_REQUESTS = Counter(
    "bc_http_requests_total",
    "HTTP requests answered, by route template, method and status code.",
    ["route", "method", "code"],
)
HTTP_REQUEST_DURATION = Histogram(
    "bc_http_request_duration_seconds",
    "Time from a request's arrival to the end of its answer, by route template (seconds).",
    ["route"],
    buckets=DURATION_BUCKETS,
)
GUARD_CODES = (
    "UNAUTHENTICATED",
    "RATE_LIMITED",
    "PAYLOAD_TOO_LARGE",
    "INVALID_INPUT",
    "NOT_FOUND",
    "UNAVAILABLE",
)
GUARD_REFUSALS = Counter(
    "bc_guard_refusals_total",
    "Requests the request guard (app/api/guard.py) answered before routing, by error code: "
    + ", ".join(GUARD_CODES)
    + ".",
    ["code"],
)
HELLOS = Counter("bc_agent_hellos_total", "Hellos from node agents, by outcome.", ["outcome"])
HEARTBEATS = Counter(
    "bc_agent_heartbeats_total",
    "Heartbeats from node agents, by outcome (unchanged: one statement).",
    ["outcome"],
)
HEARTBEATS_LOST = Counter(
    "bc_agent_heartbeats_lost_total", "Nodes marked 'heartbeat lost' by the liveness sweep."
)
AGENT_EDGES = Counter(
    "bc_agent_edges_total",
    "Edges from node agents: atoms that became unavailable, nodes that may fit more work.",
    ["edge"],
)
WAKE_RESULTS = ("placed", "pending", "quota_exceeded")
WAKE_SOURCES = ("edge", "sweep", "retry")
WAKES = Counter(
    "bc_wakes_total",
    "Pending reservations planned again by the wake-edge controller, by result: placed, pending (still "
    "does not fit, skipped) or quota_exceeded (fits, but the tenant's quota does not hold now).",
    ["result"],
)
WAKE_EDGES_HEARD = Counter(
    "bc_wake_edges_heard_total",
    "Wake edges this process acted on, by source: edge (a NOTIFY heard), sweep (the periodic safety net) or "
    "retry (a target run again: its last pass skipped a reservation another transaction held).",
    ["source"],
)
REPAIR_RESULTS = ("same_node", "other_node", "pending")
REPAIRS = Counter(
    "bc_repairs_total",
    "Allocations moved off an unhealthy or unbookable atom by BookingRepair, by result: same_node (other "
    "atoms of its node), other_node, or pending (nothing fits; the reservation waits).",
    ["result"],
)
DRAIN_MOVE_RESULTS = ("other_node", "pending", "kept")
DRAIN_MOVES = Counter(
    "bc_drain_moves_total",
    "Future reservations a drain with reschedule moved off its node, by result: other_node, pending (nothing "
    "else fits; it waits) or kept (a gang, left on the node).",
    ["result"],
)
NODE_MAINTENANCE_ACTIONS = ("drain", "undrain", "delete", "delete_refused")
NODE_MAINTENANCE = Counter(
    "bc_node_maintenance_total",
    "Node maintenance calls (docs/operating.md, Maintenance: drain and delete), by action: drain, undrain, "
    "delete, or delete_refused (409: the node holds current or future work).",
    ["action"],
)
ENDED_REASONS = (WINDOW_ENDED, WINDOW_PASSED, DEADLINE_PASSED)
RESERVATIONS_ENDED = Counter(
    "bc_reservations_ended_total",
    "Reservations the lifecycle controller ended, by the reason of their Ended condition: WindowEnded "
    "(placed, window over), WindowPassed (pending, its explicit start passed) or DeadlinePassed (pending or "
    "queued at its deadline).",
    ["reason"],
)
# 0.1 s .. ~27 h, factor 4
WAIT_BUCKETS = tuple(0.1 * 4**i for i in range(10))
WAKE_WAIT = Histogram(
    "bc_wake_wait_seconds",
    "How long a woken reservation waited pending, from its creation to its placement (seconds).",
    buckets=WAIT_BUCKETS,
)
PREEMPTION_RESULTS = ("placed", "no_fit", "lost_race")
PREEMPTION_ATTEMPTS = Counter(
    "bc_preemption_attempts_total",
    "Regular requests planned again with overlapping spot work counted as free, by result: placed (victims "
    "preempted), no_fit (preempting would not help) or lost_race (every attempt lost a race).",
    ["result"],
)
PREEMPTION_VICTIMS = Histogram(
    "bc_preemption_victims",
    "Spot reservations preempted by one placed preemptor.",
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64),
)
PLAN_TOKEN_RESULTS = ("placed", "stale", "invalid")
PLAN_TOKEN_CREATES = Counter(
    "bc_plan_token_creates_total",
    "Creates with ifPlan (docs/api.md, Plan tokens), by result: placed (the previewed plan committed), stale "
    "(412 PLAN_STALE: an atom was booked or the node changed meanwhile) or invalid (422: the token was "
    "altered, expired, or for another tenant or body).",
    ["result"],
)
EXTEND_RESULTS = ("extended", "conflict", "quota")
RESERVATION_EXTENDS = Counter(
    "bc_reservation_extends_total",
    "POST /v1/reservations/{id}/extend answers (docs/lifecycle.md, Extend), by result: extended (the window "
    "is longer), conflict (409 CONFLICT: an atom booked, a scalar run out, the node no longer schedulable, "
    "or the reservation not placed) or quota (409 QUOTA_EXCEEDED).",
    ["result"],
)
BUILD = Info("bc_build", "The running build: bc_build_info{version} is 1.")


def package_version() -> str:
    """The installed ``better-compute`` version (``unknown`` when run from a tree that is not installed)."""
    try:
        return version("better-compute")
    except PackageNotFoundError:
        return "unknown"


BUILD.info({"version": package_version()})
for _result in PLACEMENT_RESULTS:
    PLACEMENT_ATTEMPT_DURATION.labels(_result)
    for _placer in PLACERS:
        PLACEMENT_ATTEMPTS.labels(_result, _placer)
HTTP_REQUEST_DURATION.labels(UNMATCHED_ROUTE)
# the one-label metrics and every value of their label, created at zero (the module docstring)
_LABEL_VALUES: dict[Counter | Histogram, Iterable[str]] = {
    PLANS: PLAN_PATHS,
    LOST_RACES: LOST_RACE_KINDS,
    PLACEMENT_BATCH_SIZE: BATCH_SOURCES,
    QUEUED_DECIDED: ("placed", "pending"),
    GUARD_REFUSALS: GUARD_CODES,
    HELLOS: ("created", "changed", "unchanged"),
    AUDIT_EVENTS: ("2xx", "3xx", "4xx", "5xx"),
    HEARTBEATS: ("changed", "unchanged"),
    AGENT_EDGES: ("atoms_unavailable", "node_may_fit"),
    WAKES: WAKE_RESULTS,
    REPAIRS: REPAIR_RESULTS,
    RESERVATIONS_ENDED: ENDED_REASONS,
    DRAIN_MOVES: DRAIN_MOVE_RESULTS,
    NODE_MAINTENANCE: NODE_MAINTENANCE_ACTIONS,
    WAKE_EDGES_HEARD: WAKE_SOURCES,
    PREEMPTION_ATTEMPTS: PREEMPTION_RESULTS,
    PLAN_TOKEN_CREATES: PLAN_TOKEN_RESULTS,
    RESERVATION_EXTENDS: EXTEND_RESULTS,
}
for _metric, _values in _LABEL_VALUES.items():
    for _value in _values:
        _metric.labels(_value)

P = ParamSpec("P")
T = TypeVar("T")


def record_placement(
    placer: str, result_of: Callable[[T], str]
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
    """Decorate a placer: each call is one attempt, counted in ``bc_placement_attempts_total`` and timed
    in ``bc_placement_attempt_duration_seconds`` with ``result_of(outcome)`` (``placed`` or ``pending``).
    An exception is ``error``, except an :class:`~app.errors.AppError` below 500 (a refusal such as
    QUOTA_EXCEEDED, counted where it is raised), which is no placement result."""

    def decorate(place: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
        @functools.wraps(place)
        async def recorded(*args: P.args, **kwargs: P.kwargs) -> T:
            started = time.perf_counter()
            try:
                outcome = await place(*args, **kwargs)
            except AppError as exc:
                if exc.status >= 500:
                    _attempt(placer, "error", started)
                raise
            except Exception:
                _attempt(placer, "error", started)
                raise
            _attempt(placer, result_of(outcome), started)
            return outcome

        return recorded

    return decorate


def count_batch_attempts(placer: str, results: Iterable[str]) -> None:
    """Count one attempt per reservation a batch decided (``placed`` or ``pending``), under ``placer``
    (``pool-lease`` or ``bulk``); a batch is timed as a whole, not per reservation."""
    for result in results:
        PLACEMENT_ATTEMPTS.labels(result, placer).inc()


def _attempt(placer: str, result: str, started: float) -> None:
    PLACEMENT_ATTEMPTS.labels(result, placer).inc()
    PLACEMENT_ATTEMPT_DURATION.labels(result).observe(time.perf_counter() - started)


def http_method(method: str) -> str:
    """The ``method`` label: the request's method when it is a standard one, else ``other``."""
    return method if method in HTTP_METHODS else OTHER_METHOD


def observe_http(route: str, method: str, status: int, seconds: float) -> None:
    """Count and time one answered request under its route template."""
    HTTP_REQUESTS.labels(route, http_method(method), str(status)).inc()
    HTTP_REQUEST_DURATION.labels(route).observe(seconds)


def declare_routes(routes: Iterable[str]) -> None:
    """Create ``bc_http_request_duration_seconds{route}`` at zero for every route template."""
    for route in routes:
        HTTP_REQUEST_DURATION.labels(route)


class FleetGauges(Collector):
    """``bc_reservations{pool, status}`` and ``bc_atoms{pool, class, state}`` from the last census.

    :meth:`refresh` counts in PostgreSQL (async, when ``/metrics`` is served); :meth:`collect` (called
    by prometheus_client while it renders) only yields what the last refresh read. When the database
    cannot be read, the two gauges are left out of the scrape rather than served stale."""

    def __init__(self) -> None:
        self.reservations: dict[tuple[str, str], int] | None = None
        self.atoms: dict[tuple[str, str, str], int] | None = None
        self.read_at = float("-inf")
        self.lock = asyncio.Lock()

    async def refresh(self, engine: AsyncEngine, ttl: float) -> None:
        """Count again unless the last count is younger than ``ttl`` seconds (concurrent scrapes share
        one count)."""
        async with self.lock:
            if time.monotonic() - self.read_at < ttl and self.reservations is not None:
                return
            try:
                async with asyncio.timeout(GAUGE_READ_TIMEOUT), engine.connect() as conn:
                    reservations = await census.reservation_counts(conn)
                    atoms = await census.atom_counts(conn)
            except Exception as exc:  # an outage must not break the scrape of everything else
                log.warning("bc_reservations and bc_atoms left out of this scrape: %s", type(exc).__name__)
                self.reservations = self.atoms = None
                self.read_at = float("-inf")
                return
            self.reservations, self.atoms, self.read_at = reservations, atoms, time.monotonic()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.reservations is None or self.atoms is None:
            return
        reservations = GaugeMetricFamily(
            "bc_reservations", "Reservations now, by pool and status.", labels=["pool", "status"]
        )
        for (pool, status), count in sorted(self.reservations.items()):
            reservations.add_metric([pool, status], count)
        yield reservations
        atoms = GaugeMetricFamily(
            "bc_atoms",
            "Atoms (GPUs, MIG slices) now, by pool, class and state: free, booked (held by a booking now), "
            "unhealthy (unhealthy or unbookable), unschedulable (the node takes no work).",
            labels=["pool", "class", "state"],
        )
        for (pool, cls, state), count in sorted(self.atoms.items()):
            atoms.add_metric([pool, cls, state], count)
        yield atoms


FLEET_GAUGES = FleetGauges()
REGISTRY.register(FLEET_GAUGES)
_scraped: CollectorRegistry = REGISTRY  # what /metrics renders (scrape_from)


def scrape_from(folder: Path | None) -> None:
    """Serve this process's registry (``folder`` None: one process), or every worker's counters,
    histograms and gauges merged from ``folder`` with the build info and the fleet gauges added once
    (``serve --workers N``, :mod:`app.observability.multiprocess`)."""
    global _scraped
    _scraped = REGISTRY if folder is None else merged_registry(folder, BUILD, FLEET_GAUGES)


async def exposition(engine: AsyncEngine, gauge_ttl: float) -> bytes:
    """The text exposition of every metric, after refreshing the fleet gauges (at most every
    ``gauge_ttl`` seconds)."""
    await FLEET_GAUGES.refresh(engine, gauge_ttl)
    return prometheus_client.generate_latest(_scraped)
