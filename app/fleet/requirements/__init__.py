"""The hard requirements of docs/explain.md ("Hard requirements and their reasons"), one module each, in
the documented order.

Every module declares ``NAME`` (the prefix of each of its reasons: ``<NAME>: <detail>``), ``RULE``
(what it rejects, in one line) and ``check(target, request, ctx) -> list[str]`` (see
:mod:`app.fleet.requirements.context`). :data:`REQUIREMENTS` is the registry: the explanation runs every
check in this order and keeps every reason. Adding a requirement: a module here, its place in the tuple,
its table test in ``tests/fleet/requirements/`` (docs/explain.md lists the reasons). Pure: no clock, no
I/O.
"""

from __future__ import annotations

from types import ModuleType

from app.fleet.documents import FleetTarget, PlacementRequestDoc
from app.fleet.requirements import (
    account,
    availability,
    data_access,
    execution_bound,
    freshness,
    gpus,
    isa,
    licenses,
    node_shape,
    nodes,
    os,
    program,
    queue,
    scratch,
    walltime_limit,
)
from app.fleet.requirements.context import Context

REQUIREMENTS: tuple[ModuleType, ...] = (
    availability,
    freshness,
    program,
    os,
    isa,
    account,
    queue,
    data_access,
    licenses,
    nodes,
    node_shape,
    scratch,
    gpus,
    walltime_limit,
    execution_bound,
)
"""The hard requirements in the documented order; every one runs, and every reason is kept."""


def reasons_for(target: FleetTarget, request: PlacementRequestDoc, ctx: Context) -> list[str]:
    """Every reason ``target`` fails ``request`` for, requirement by requirement in the documented order."""
    return [text for requirement in REQUIREMENTS for text in requirement.check(target, request, ctx)]
