"""Live collection for ``placement fleet`` (docs/fleet.md, "Commands"): the I/O half of the fleet build.

:func:`build_from_hosts` checks the whole plan first (:func:`app.fleet.build_plan.check_plan`: every refusal
happens before any host is contacted), then asks only the named hosts, concurrently, over
:mod:`app.fleet.ssh` (bounded output, ``timeout_seconds``, one replay of a transport failure), and hands
the answers to the pure :func:`app.fleet.build.build_fleet`. A host that gives no answer is recorded as
docs/fleet.md says (unreachable, or base kept) and the build goes on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from app.errors import InvalidInput
from app.fleet.build import (
    BuildResult,
    CapacityEvidence,
    FleetEvidence,
    HistoryOptions,
    RuntimeEvidence,
    ShapeEvidence,
    build_fleet,
)
from app.fleet.build_plan import BuildPlan, check_plan
from app.fleet.capacity import CapacityAnswer, load_capacity_answer
from app.fleet.documents import FleetTarget, PlacementFleet
from app.fleet.history import JobRecord
from app.fleet.pbs import pbsnodes_command, qstat_command
from app.fleet.runtimes import generations_command, load_runtime_listing
from app.fleet.slurm import shape_command
from app.fleet.ssh import (
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_TIMEOUT_SECONDS,
    CommandFailed,
    HostConfig,
    run_command,
)

T = TypeVar("T")


def capacity_command(target: FleetTarget) -> list[str]:
    """``vq broker capacity --json`` asking only for the programs the base record lists."""
    argv = ["vq", "broker", "capacity", "--json"]
    for program in sorted(target.programs):
        argv += ["--program", program]
    return argv


def _json_answer(text: str, what: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise CommandFailed(f"{what} is not JSON: {error.msg} at line {error.lineno}") from None


@dataclass(frozen=True, slots=True)
class _Fetch:
    """A JSON document fetched over SSH: the command, what the document is called when it is not JSON
    (``the listing``), the prefix of a failure to validate (``malformed listing``), the wait (seconds)
    and the output limit (bytes)."""

    argv: list[str]
    what: str
    malformed: str
    wait_s: float
    limit: int


@dataclass(frozen=True, slots=True)
class _Failed:
    """Why a fetch gave no document: the command's failure or ``<malformed>: <message>``."""

    reason: str


async def _fetch_document(host: HostConfig, fetch: _Fetch, load: Callable[[object], T]) -> T | _Failed:
    """Run ``fetch.argv`` on ``host`` and ``load`` its JSON output, or why that failed."""
    try:
        result = await run_command(
            host, fetch.argv, timeout_seconds=fetch.wait_s, max_output_bytes=fetch.limit
        )
        return load(_json_answer(result.checked(), fetch.what))
    except CommandFailed as failure:
        return _Failed(failure.reason)
    except InvalidInput as error:
        return _Failed(f"{fetch.malformed}: {error.message}")


async def _collect_capacity(
    host: HostConfig, target: FleetTarget, wait_s: float, limit: int, clock: Callable[[], datetime]
) -> CapacityEvidence:
    called_at = clock()
    fetch = _Fetch(capacity_command(target), "the capacity answer", "malformed answer", wait_s, limit)
    answer = await _fetch_document(host, fetch, load_capacity_answer)
    if isinstance(answer, _Failed):
        return CapacityEvidence(failure=answer.reason)
    return CapacityEvidence(answer=answer, answered_at=called_at)


async def _collect_shape(host: HostConfig, queue: str, wait_s: float, limit: int) -> ShapeEvidence:
    if host.scheduler == "slurm":
        try:
            result = await run_command(
                host, shape_command(queue), timeout_seconds=wait_s, max_output_bytes=limit
            )
            return ShapeEvidence("slurm", sinfo=result.checked())
        except CommandFailed as failure:
            return ShapeEvidence("slurm", failure=f"sinfo on {host.name}: {failure.reason}")
    try:
        result = await run_command(host, qstat_command(queue), timeout_seconds=wait_s, max_output_bytes=limit)
        qstat = result.checked()
    except CommandFailed as failure:
        return ShapeEvidence("pbs", failure=f"qstat on {host.name}: {failure.reason}")
    try:
        result = await run_command(host, pbsnodes_command(), timeout_seconds=wait_s, max_output_bytes=limit)
        return ShapeEvidence("pbs", qstat=qstat, pbsnodes=result.checked())
    except CommandFailed as failure:
        return ShapeEvidence(
            "pbs", qstat=qstat, pbsnodes_failure=f"pbsnodes on {host.name}: {failure.reason}"
        )


async def _collect_runtimes(host: HostConfig, root: str, wait_s: float, limit: int) -> RuntimeEvidence:
    fetch = _Fetch(generations_command(root), "the listing", "malformed listing", wait_s, limit)
    listing = await _fetch_document(host, fetch, load_runtime_listing)
    if isinstance(listing, _Failed):
        return RuntimeEvidence(failure=listing.reason)
    return RuntimeEvidence(listing=listing)


async def build_from_hosts(
    base: PlacementFleet,
    plan: BuildPlan,
    hosts: Mapping[str, HostConfig],
    *,
    capacity: Mapping[str, CapacityAnswer] | None = None,
    jobs: Sequence[JobRecord] = (),
    history: HistoryOptions = HistoryOptions(),
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> BuildResult:
    """Check the plan, collect over SSH from the named hosts only, and build (docs/fleet.md).

    ``capacity``: ``--capacity`` answers already read (dated by their ``sampled_at``); ``jobs``: this
    host's job records for ``--queue-history``. ``clock`` is this host's clock: it dates collected
    answers (at the call, less the snapshot age) and failed observations (``now``). Raises
    :class:`app.fleet.build_plan.FleetBuildRefused` before any contact when the plan is refused.
    """
    check_plan(base, plan, {name: host.scheduler for name, host in hosts.items()})
    targets = {target.name: target for target in base.targets}
    limit, wait_s = max_output_bytes, timeout_seconds
    collect_names = list(plan.collect)
    shape_lanes = list(plan.scheduler_shape)
    runtime_names = list(plan.runtime_root)
    results = await asyncio.gather(
        *(_collect_capacity(hosts[name], targets[name], wait_s, limit, clock) for name in collect_names),
        *(
            _collect_shape(hosts[host], targets[lane].queue or "", wait_s, limit)
            for lane, host in shape_lanes
        ),
        *(_collect_runtimes(hosts[name], root, wait_s, limit) for name, root in runtime_names),
    )
    collected = dict(zip(collect_names, results[: len(collect_names)], strict=True))
    offset = len(collect_names)
    shapes = {lane: results[offset + i] for i, (lane, _) in enumerate(shape_lanes)}
    offset += len(shape_lanes)
    runtimes = {name: results[offset + i] for i, (name, _) in enumerate(runtime_names)}
    evidence = FleetEvidence(
        capacity={name: CapacityEvidence(answer=answer) for name, answer in (capacity or {}).items()},
        collected=collected,  # type: ignore[arg-type]
        queue_history=plan.queue_history,
        jobs=jobs,
        history=history,
        shapes=shapes,  # type: ignore[arg-type]
        runtimes=runtimes,  # type: ignore[arg-type]
    )
    return build_fleet(base, evidence, clock())
