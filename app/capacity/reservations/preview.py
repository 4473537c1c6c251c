"""Preview a placement (``POST /v1/capacity/preview``; docs/placement-rules.md, "Previewing a
placement"): the placement pipeline without the commit, answered as a ``Preview``. Checks neither quota
nor writes.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from app.answers.reservations import Candidate, Earliest, EarliestMember, Preemptible, Preview
from app.capacity.conditions import why_not_fields
from app.capacity.config import PREVIEW_CANDIDATES, CapacityConfig
from app.capacity.placing import preemption
from app.capacity.placing.inline import db_now
from app.capacity.planning.admission import read_verdict, refusal
from app.capacity.planning.earliest import EarliestWindow, find_earliest
from app.capacity.planning.plan import plan_request
from app.capacity.planning.planned import planned_in_the_way, planned_note
from app.capacity.planning.snapshot import PoolCache
from app.capacity.requests import check_start, placement_request
from app.capacity.reservations.plan_tokens import sign_preview
from app.capacity.views import with_warnings
from app.errors import InvalidInput
from app.placement.model import Candidate as Ranked
from app.placement.model import Plan, Rejections
from app.placement.request import ReservationRequest
from app.placement.summary import ARCHIVED_POOL


async def preview(
    engine: AsyncEngine, cache: PoolCache, config: CapacityConfig, body: ReservationRequest
) -> Preview:
    """``{fits, candidates: [{nodeId, nodeName, atoms, score, scores}], reason?, satisfiable?, warnings?,
    preemptible?, earliest?, earliestReason?}`` with up to 10 candidates, best first (for a gang: its
    members; scores rounded to 6 places). A ``reason`` ends with ``; planned windows of <n> pending
    reservations hold what it needs`` when it would fit without them
    (:mod:`app.capacity.planning.planned`). ``rejections`` / ``nearestMisses``: when it does not fit, one
    row per distinct reason (counts adding up to the pool's nodes) and up to 3 nodes closest to fitting
    (docs/reasons.md). ``earliest``: when it does not fit for its window, the first
    window at which it does (:func:`~app.capacity.planning.earliest.find_earliest`), or null with
    ``earliestReason`` (docs/lifecycle.md, "Earliest start"); absent when it fits. ``satisfiable:
    false``: no node of the pool as built could ever hold it (not an error here;
    docs/api.md, "Checked at intake"). ``preemptible``: a regular request that fits only by preempting
    spot work (:func:`~app.capacity.placing.preemption.preemptible_view`). Raises InvalidInput
    (``start``, or a request intake refuses) and NotFound (pool)."""
    async with engine.connect() as conn:
        now = await db_now(conn)
        check_start(body, now, config.max_lead)
        request = placement_request(config, body, now)
        outcome = await plan_request(
            conn,
            cache,
            request,
            config.options,
            config.shortlist_min,
            max(config.options.top_n, PREVIEW_CANDIDATES),
        )
        intake = await read_verdict(conn, cache, outcome.head, request)  # the cached inventory: no read
        error = refusal(intake)
        if isinstance(error, InvalidInput):
            raise error
        if intake.unsatisfiable is not None:
            # it fits nowhere as the pool is built (docs/api.md, "Checked at intake"): not an error here;
            # the reason is the rejections' summary, as for any request that does not fit
            plan = outcome.plan
            summary = plan.summary if isinstance(plan, Rejections) else intake.unsatisfiable
            answer = Preview(
                fits=False,
                satisfiable=False,
                candidates=[],
                reason=summary,
                unsatisfiableReason=intake.unsatisfiable,
                **why_not_fields(outcome.why_not(request, config.options)),
            )
            return with_warnings(answer, intake.warnings)
        preemptible: Preemptible | None = None
        in_the_way = 0  # pending reservations whose planned windows are why it does not fit
        later: Earliest | None = None
        later_reason: str | None = None
        if not isinstance(outcome.plan, Plan) and not outcome.head.archived:
            if preemption.applies(config.preemption, request):
                preemptible = await preemption.preview_preemptible(conn, cache, request, config.options, now)
            in_the_way = await planned_in_the_way(conn, cache, request, config.options, outcome.head)
            found = await find_earliest(
                conn, cache, config, request, now, head=outcome.head, first_failed=True
            )
            if isinstance(found, EarliestWindow):
                later = earliest_answer(found)
            else:
                later_reason = found.reason
    if outcome.head.archived:
        return Preview(fits=False, candidates=[], reason=ARCHIVED_POOL)
    plan = outcome.plan
    if not isinstance(plan, Plan):
        reason = f"{plan.summary}; {planned_note(in_the_way)}" if in_the_way else plan.summary
        why = why_not_fields(outcome.why_not(request, config.options))
        answer = Preview(fits=False, candidates=[], reason=reason, earliest=later, **why)
        if later is None:
            answer.earliestReason = later_reason
        if preemptible is not None:
            answer.preemptible = preemptible
        return with_warnings(answer, intake.warnings)
    # a gang preview shows the members of the best gang (docs/placement-rules.md, "Previewing a placement")
    ranked = plan.members or plan.ranked[:PREVIEW_CANDIDATES]
    answer = Preview(fits=True, candidates=[candidate(c) for c in ranked])
    # what a create with ifPlan commits exactly (docs/api.md, "Plan tokens")
    await sign_preview(engine, config, body, request, ranked, answer, gang=bool(plan.members))
    return with_warnings(answer, intake.warnings)


def candidate(ranked: Ranked) -> Candidate:
    """A preview candidate of a ranked node: its atoms, total score and each scorer's, rounded to 6
    places."""
    return Candidate(
        nodeId=ranked.node_id,
        nodeName=ranked.node_name,
        atoms=list(ranked.atoms),
        score=round(ranked.score, 6),
        scores={k: round(v, 6) for k, v in ranked.scores.items()},
    )


def earliest_answer(found: EarliestWindow) -> Earliest:
    """The ``earliest`` of a preview: the window and its best node (a gang: the first member, and every
    member in ``members``)."""
    assert found.request.start is not None and found.request.end is not None
    placements = found.placements
    first = placements[0]
    answer = Earliest(
        start=found.request.start.isoformat(),
        end=found.request.end.isoformat(),
        nodeId=first.node_id,
        nodeName=first.node_name,
        atoms=list(first.atoms),
    )
    if found.request.gang is not None and found.request.gang.members > 1:
        answer.members = [
            EarliestMember(nodeId=c.node_id, nodeName=c.node_name, atoms=list(c.atoms)) for c in placements
        ]
    return answer
