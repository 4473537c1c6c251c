"""Filters own their state (issue 16): the registry declares what each filter reads (derived per node in
one place, :mod:`app.placement.derived`), what it writes (only ``picker``) and which filters it assumes
passed; these tests check the declarations against each other and against the code, and that each
filter, run alone on a fresh node with only what it declares, gives the pipeline's reason."""

from __future__ import annotations

import ast
import inspect
from typing import Any

import pytest

import app.placement.derived as derived
from app.placement.context import NodeWork, PlanContext
from app.placement.derived import DERIVATIONS, DERIVED_FIELDS, derivations_for
from app.placement.filters import (
    FILTER_NAMES,
    FILTERS,
    applies,
    fits,
    picker,
    plan_steps,
    schedulable,
    selector,
)
from app.placement.options import SchedulerOptions
from app.placement.scorers.contract import READS as SCORER_READS
from app.placement.selectors import parse_selector
from tests.factories import gpu_snapshot
from tests.placement.builders import pool, request
from tests.placement.test_filters import REASONS, reason_for

OWN_FIELDS = {"node", "topology"}  # set by NodeWork itself, not by any step


def _writes(flt: Any) -> tuple[str, ...]:
    return getattr(flt, "WRITES", ())


BUILTIN_ORDER = (
    "schedulable",
    "labels",
    "plugins",
    "scalars",
    "selector",
    "fits",
    "topology",
    "picker",
    "lease",
)


def test_the_order_is_the_seeds() -> None:
    # the built-ins in the specified order (docs/placement-rules.md); a filter added to the registry
    # may stand between them (docs/extending.md), never reorder them
    assert tuple(name for name in FILTER_NAMES if name in BUILTIN_ORDER) == BUILTIN_ORDER


def _builtin_steps(steps: tuple[Any, ...]) -> tuple[Any, ...]:
    """The steps of a plan but the checks of filters added to the registry after the built-ins."""
    added = {flt.check for flt in FILTERS if flt.NAME not in BUILTIN_ORDER}
    return tuple(step for step in steps if step not in added)


def test_every_field_has_one_producer_and_is_produced_before_it_is_read() -> None:
    producers: dict[str, str] = {}
    for d in DERIVATIONS:
        for needed in d.needs:
            assert needed in producers, (d.name, needed)  # derivations need earlier ones only
        for provided in d.provides:
            assert provided not in producers, provided
            producers[provided] = d.name
    for flt in FILTERS:
        for field in flt.READS:
            assert field in producers, (flt.NAME, field)
        for field in _writes(flt):
            assert field not in producers, (flt.NAME, field)  # one writer per field
            producers[field] = flt.NAME
        seen = FILTER_NAMES[: FILTER_NAMES.index(flt.NAME)]
        for earlier in flt.AFTER:
            assert earlier in seen, (flt.NAME, earlier)
    assert [f.NAME for f in FILTERS if _writes(f)] == ["picker"]
    for kind, fields in SCORER_READS.items():
        assert set(fields) <= set(producers), kind


@pytest.mark.parametrize("flt", FILTERS, ids=FILTER_NAMES)
def test_a_filter_touches_only_the_fields_it_declares(flt: Any) -> None:
    # Every ``work.<field>`` the module's code reads must be declared in READS (or WRITES, or NodeWork's
    # own node/topology), and it may assign only the fields it WRITES.
    tree = ast.parse(inspect.getsource(flt))
    read, assigned = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "work":
            (assigned if isinstance(node.ctx, ast.Store) else read).add(node.attr)
    assert read <= set(flt.READS) | set(_writes(flt)) | OWN_FIELDS, read
    assert assigned == set(_writes(flt))


def test_derivations_fill_only_what_they_provide() -> None:
    for d in DERIVATIONS:
        tree = ast.parse(inspect.getsource(getattr(derived, d.run.__name__)))
        assigned = {
            n.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute)
            and isinstance(n.ctx, ast.Store)
            and getattr(n.value, "id", "") == "work"
        }
        assert assigned == set(d.provides), d.name
    assert DERIVED_FIELDS == {"classes", "match_masks", "available_masks", "free_masks"}


@pytest.mark.parametrize(
    ("case", "node_args", "request_args", "reason"), REASONS, ids=[r[0] for r in REASONS]
)
def test_each_filter_alone_gives_the_pipelines_reason(
    case: str, node_args: dict[str, Any], request_args: dict[str, Any], reason: str | None
) -> None:
    # Each filter on its own fresh NodeWork, with only the derivations it declares: no filter relies on
    # what another one left behind. A filter that does not apply to the request must pass.
    node, req = gpu_snapshot(**node_args), request(**request_args)
    ctx = PlanContext.build(req, pool(node), SchedulerOptions())
    found = None
    for flt in FILTERS:
        work = NodeWork(node, len(ctx.devices))
        for d in derivations_for(flt.READS):
            d.run(ctx, work)
        found = flt.check(ctx, work)
        if not applies(flt, ctx):
            assert found is None, flt.NAME
        if found is not None:
            break
    assert found == reason == reason_for(node, req)


def test_the_steps_derive_before_the_first_reader_and_skip_filters_that_cannot_reject() -> None:
    ctx = PlanContext.build(request(count=2), pool(gpu_snapshot()), SchedulerOptions())
    assert _builtin_steps(plan_steps(ctx)) == (
        schedulable.check,
        derived.matches,
        derived.free,
        fits.check,
        picker.check,
    )
    with_selector = request(count=2, selector=parse_selector("x"))
    ctx = PlanContext.build(with_selector, pool(gpu_snapshot()), SchedulerOptions())
    assert _builtin_steps(plan_steps(ctx))[:3] == (schedulable.check, derived.matches, selector.check)
    ctx = PlanContext.build(request(count=0), pool(gpu_snapshot()), SchedulerOptions())
    assert _builtin_steps(plan_steps(ctx)) == (schedulable.check,)
    assert _builtin_steps(plan_steps(ctx, SCORER_READS["counts"])) == (
        schedulable.check,
        derived.matches,
        derived.free,
    )
