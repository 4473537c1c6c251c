"""The filter registry: ONE ordered tuple (docs/reasons.md; the order and the reason strings are
normative, docs/placement-rules.md). A node is rejected by the first filter that returns a reason.

Each entry is a module with ``NAME``, ``REQUEST_READS`` and ``NODE_READS`` (the request and node fields
it reads, :mod:`app.placement.reads`; the batch memo key is derived from them, docs/extending.md, "What a
filter reads"), ``READS`` (the :mod:`app.placement.derived` fields it reads),
``AFTER`` (the filters whose passing it assumes, which must come earlier), optionally ``WRITES`` (only
``picker``, whose pick scorers read) and ``applies(ctx) -> bool`` (False: the filter cannot reject this
request, so it is left out of the plan's steps), and ``check(ctx, work) -> str | None``.
:func:`plan_steps` turns the registry into the steps one node goes through: each derivation just
before the first filter or scorer that reads it, then the filters in order.
"""

from __future__ import annotations

from types import ModuleType

from app.placement.context import PlanContext
from app.placement.derived import Step, derivations_for
from app.placement.filters import (
    fits,
    labels,
    lease,
    picker,
    plugins,
    scalars,
    schedulable,
    selector,
    topology,
)

FILTERS: tuple[ModuleType, ...] = (
    schedulable,
    labels,
    plugins,
    scalars,
    selector,
    fits,
    topology,
    picker,
    lease,
)
FILTER_NAMES: tuple[str, ...] = tuple(f.NAME for f in FILTERS)
# a step of :func:`plan_steps` -> the name of the filter it checks (derivations reject nothing)
FILTER_OF_STEP: dict[Step, str] = {f.check: f.NAME for f in FILTERS}
# the filter name of a node excluded after a lost commit race (options.excluded_nodes)
EXCLUDED = "excluded"


def applies(flt: ModuleType, ctx: PlanContext) -> bool:
    """The filter's ``applies(ctx)``, True when it declares none."""
    fn = getattr(flt, "applies", None)
    return True if fn is None else bool(fn(ctx))


def plan_steps(ctx: PlanContext, scorer_reads: tuple[str, ...] = ()) -> tuple[Step, ...]:
    """The steps for one node of this plan: the applying filters' checks in registry order, each
    preceded by the derivations it reads that have not run yet, then those ``scorer_reads`` needs.
    Memoized by (which filters apply, ``scorer_reads``)."""
    applying = tuple(applies(flt, ctx) for flt in FILTERS)
    key = (applying, scorer_reads)
    found = _steps.get(key)
    if found is None:
        found = _steps[key] = _steps_for(applying, scorer_reads)
    return found


_steps: dict[tuple[tuple[bool, ...], tuple[str, ...]], tuple[Step, ...]] = {}


def _steps_for(applying: tuple[bool, ...], scorer_reads: tuple[str, ...]) -> tuple[Step, ...]:
    steps: list[Step] = []
    done: set[str] = set()

    def derive(fields: tuple[str, ...]) -> None:
        for d in derivations_for(fields):
            if d.name not in done:
                done.add(d.name)
                steps.append(d.run)

    for flt, applying_here in zip(FILTERS, applying, strict=True):
        if applying_here:
            derive(flt.READS)
            steps.append(flt.check)
    derive(scorer_reads)
    return tuple(steps)
