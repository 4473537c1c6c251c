"""Explain one job's completion-time placement over a fleet (docs/explain.md, "Hard requirements
and their reasons", "Completion and ranking").

:func:`explain_placement` is pure: the fleet, the request, ``now`` and ``max_age_seconds`` in, an
:class:`Explanation` out. No clock, no I/O; the same inputs always give the same explanation.

Every target is checked against every hard requirement of :data:`app.fleet.requirements.REQUIREMENTS`
(the documented order, docs/explain.md); a target failing any is rejected with *all* the reasons that
apply, each a whole
text ``<requirement>: <detail>``. The others are ranked by predicted completion
(:mod:`app.fleet.prediction`): complete predictions first, then by completion midpoint, upper bound, the
faster target (higher ``speed_factor``) and the name; a prediction with an unknown component ranks after
them by the same keys over its known part. With no eligible target the job is held. Text and JSON:
:mod:`app.fleet.render`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.errors import InvalidInput, errors_under
from app.fleet.documents import FleetTarget, PlacementFleet, PlacementRequestDoc, load_fleet, load_request
from app.fleet.estimate import (
    CalibratedEstimate,
    EstimateReport,
    apply_estimate,
    check_estimate_program,
    load_estimate,
)
from app.fleet.prediction import Candidate, Completion, Explanation, Rejection, completion_of, components_for
from app.fleet.render import to_json
from app.fleet.requirements import reasons_for
from app.fleet.requirements.context import Context
from app.fleet.requirements.freshness import DEFAULT_MAX_AGE_SECONDS

__all__ = ["DEFAULT_MAX_AGE_SECONDS", "explain_documents", "explain_placement"]  # the routes import these


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


def _check_arguments(now: datetime, max_age_seconds: int) -> None:
    if now.tzinfo is None or now.utcoffset() is None:
        raise InvalidInput("now: must carry a UTC offset, e.g. 2026-10-12T12:00:00+00:00", path="now")
    if isinstance(max_age_seconds, bool) or not isinstance(max_age_seconds, int) or max_age_seconds < 0:
        raise InvalidInput("max_age: must be a whole number of seconds, 0 or more", path="max_age")


def _candidate(
    target: FleetTarget, request: PlacementRequestDoc, age: float, report: EstimateReport | None
) -> Candidate:
    """An eligible target's prediction, unranked (rank 0 until :func:`_ranked`)."""
    components = components_for(target, request, report)
    return Candidate(
        rank=0,
        target=target,
        runtime_digest=request.runtime_digest or target.programs[request.program][0],
        data_age_seconds=age,
        components=components,
        completion=completion_of(components),
    )


def _ranked(candidates: list[Candidate]) -> tuple[Candidate, ...]:
    ordered = sorted(candidates, key=lambda c: ranking_key(c.target, c.completion))
    return tuple(
        Candidate(
            rank=index + 1,
            target=c.target,
            runtime_digest=c.runtime_digest,
            data_age_seconds=c.data_age_seconds,
            components=c.components,
            completion=c.completion,
        )
        for index, c in enumerate(ordered)
    )


def _held_reason(fleet: PlacementFleet, rejected: list[Rejection]) -> str:
    if not fleet.targets:
        return "the fleet has no targets"
    return f"no eligible target: {len(rejected)} of {len(fleet.targets)} rejected"


def explain_placement(
    fleet: PlacementFleet,
    request: PlacementRequestDoc,
    now: datetime,
    max_age_seconds: int = DEFAULT_MAX_AGE_SECONDS,
    estimate: CalibratedEstimate | None = None,
) -> Explanation:
    """Apply docs/explain.md's completion-time placement policy to one job.

    ``now`` (timezone-aware) dates every observation: data age = ``now - observed_at`` in seconds;
    older than ``max_age_seconds`` (equality fits) or more than 60 s in the future rejects. With
    ``estimate`` (a validated ``vq.calibrated-estimate/1``), unset ``runtime_seconds`` and
    ``mem_mb_per_node`` are filled first and the explanation carries the estimate report.

    Returns the :class:`Explanation`: candidates ranked (complete first, then midpoint, upper bound,
    faster, name), every rejected target with all its reasons, and ``held`` with a reason when nothing
    is eligible. Raises :class:`InvalidInput` for a naive ``now``, a negative ``max_age_seconds`` or an
    estimate for another program.
    """
    _check_arguments(now, max_age_seconds)
    report = None
    if estimate is not None:
        request, report = apply_estimate(request, estimate)
    candidates: list[Candidate] = []
    rejected: list[Rejection] = []
    for target in fleet.targets:
        age = (now - target.observed_at).total_seconds() if target.observed_at is not None else None
        reasons = reasons_for(target, request, Context(now, max_age_seconds, age))
        if reasons or age is None:
            rejected.append(Rejection(target=target, data_age_seconds=age, reasons=tuple(reasons)))
        else:
            candidates.append(_candidate(target, request, age, report))
    return Explanation(
        now=now,
        max_age_seconds=max_age_seconds,
        request=request,
        estimate=report,
        candidates=_ranked(candidates),
        rejected=tuple(rejected),
        held_reason=None if candidates else _held_reason(fleet, rejected),
    )


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
    with errors_under("fleet"):
        fleet_doc = load_fleet(fleet)
    with errors_under("request"):
        request_doc = load_request(request)
    estimate_doc: CalibratedEstimate | None = None
    if estimate is not None:
        with errors_under("estimate"):
            estimate_doc = load_estimate(estimate)
            check_estimate_program(request_doc, estimate_doc)
    explanation = explain_placement(
        fleet_doc, request_doc, now, max_age_seconds=max_age_seconds, estimate=estimate_doc
    )
    return to_json(explanation)
