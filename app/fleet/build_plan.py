"""Refuse a fleet build's plan before any host is contacted (docs/fleet.md, "Refusals (all before any host
is contacted)"):
the first of the build's two pure steps (the second is :func:`app.fleet.build.build_fleet`).

:func:`check_plan` refuses everything docs/fleet.md refuses: an answer for an unknown target or a scheduler
lane, two answers for one target, ``--collect`` of a lane, an unknown target or an unconfigured host, a
target named by both ``--capacity`` and ``--collect``, a ``--queue-history`` target that is not a lane, a
``--scheduler-shape`` lane that is not a lane, has no queue, or whose host is not a configured Slurm/PBS
host, the same lane twice, and a ``--runtime-root`` target that is not a daemon, an unconfigured host, a
relative ROOT or the same target twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

from app.errors import InvalidInput, quote_input
from app.fleet.documents import PlacementFleet

Scheduler = Literal["slurm", "pbs"]


class FleetBuildRefused(InvalidInput):
    """The build is refused before any host is contacted (HTTP 422, CLI exit 2); ``path`` names the
    option and target, e.g. ``collect.cluster-a/compute``."""


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
    """Refuse the plan before any host is contacted (docs/fleet.md's refusal lists; see the module doc).

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
