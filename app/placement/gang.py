"""Gang placement: ``gang: {members, topologyKey?}`` places ``members`` copies of the request's shape on
distinct nodes, all sharing one value of the node label ``topologyKey`` when it is given (a rack, a
fabric domain). Pure, like the rest of the pipeline.

Each node is judged for one member by the ordinary pipeline (filters in order, the atom pick, the
scorers), so a member's candidates and rejections read exactly as a one-member request's would. Among
the candidates, the nodes are grouped by their ``topologyKey`` value (one group without it); a group
qualifies with at least ``members`` candidates, and the gang takes the group whose best ``members``
candidates have the highest total score (ties: the group value), and those candidates in ranking order.
A gang is all or nothing: the commit writes every member in one savepoint.

Nothing fits when no group qualifies: the pending reason is
``gang: <members> members need <members> nodes[ with the same <key>], <n> fit[ (best <key>=<value>: <k>)]``
after the per-node summary of the nodes that did not fit at all, if any.
"""

from __future__ import annotations

from dataclasses import replace

from app.placement.model import Candidate, PlacementRequest, Plan, PoolSnapshot, Rejections
from app.placement.options import SchedulerOptions
from app.placement.pipeline import plan_placement
from app.placement.summary import summarize

NO_GROUP = ""
GANG = "gang"  # the filter name of a node rejected by the gang's grouping (docs/reasons.md)


def plan_gang(
    request: PlacementRequest, snapshot: PoolSnapshot, options: SchedulerOptions
) -> Plan | Rejections:
    """Plan a gang (``request.gang.members`` >= 1) on ``snapshot``: a :class:`Plan` whose ``members`` are
    the chosen candidates on distinct nodes (``chosen`` is the first, ``ranked`` every candidate of a
    member), or :class:`Rejections` with the gang's pending reason."""
    assert request.gang is not None
    members, key = request.gang.members, request.gang.topology_key
    member_plan = plan_placement(replace(request, gang=None), snapshot, options)
    if isinstance(member_plan, Rejections) and not member_plan.by_node:
        return member_plan  # an empty or archived pool, or an admit hook's refusal
    ranked = member_plan.ranked if isinstance(member_plan, Plan) else ()
    rejections = dict(member_plan.rejections if isinstance(member_plan, Plan) else member_plan.by_node)
    filters = dict(member_plan.filters)
    labels = {n.id: n.inventory.labels for n in snapshot.nodes}
    groups: dict[str, list[Candidate]] = {}
    for candidate in ranked:  # best first
        value = NO_GROUP if key is None else labels[candidate.node_id].get(key)
        if value is None:
            rejections[candidate.node_id] = f"gang: missing {key}"
            filters[candidate.node_id] = GANG
            continue
        groups.setdefault(value, []).append(candidate)
    qualified = [
        (-sum(c.score for c in group[:members]), value, group[:members])
        for value, group in groups.items()
        if len(group) >= members
    ]
    if not qualified:
        best = max(groups.items(), key=lambda item: (len(item[1]), item[0]), default=None)
        same = f" with the same {key}" if key else ""
        reason = f"gang: {members} members need {members} nodes{same}, {len(ranked)} fit"
        if key and best is not None:
            reason += f" (best {key}={best[0]}: {len(best[1])})"
        failed = {n: r for n, r in rejections.items() if not r.startswith("gang:")}
        summary = f"{summarize(failed, len(snapshot.nodes))}; {reason}" if failed else reason
        for candidate in ranked:  # every member candidate left: the gang could not be formed
            rejections.setdefault(candidate.node_id, reason)
            filters.setdefault(candidate.node_id, GANG)
        return Rejections(by_node=rejections, summary=summary, filters=filters)
    qualified.sort(key=lambda item: (item[0], item[1]))
    chosen = tuple(qualified[0][2])
    return Plan(chosen=chosen[0], ranked=ranked, rejections=rejections, members=chosen, filters=filters)
