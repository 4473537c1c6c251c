"""``plan_placement``'s per-node memo (issue 15: a batch's plans of one shape reuse the per-node
outcomes of nodes whose snapshot did not change): the same plan as without it, seeds and exclusions
still apply, and a node whose snapshot object changed is planned again."""

from __future__ import annotations

from dataclasses import replace

from app.placement.model import Plan, Rejections
from app.placement.options import SchedulerOptions
from app.placement.pipeline import NodeMemos, plan_placement
from tests.factories import gpu_snapshot
from tests.placement.builders import pool, request


def _nodes() -> list:
    return [
        gpu_snapshot("a", gpus=4, booked=(0, 1), resources={"cpu": ("16", "1", "0")}),
        gpu_snapshot("b", gpus=4, resources={"cpu": ("16", "1", "14")}),  # too little cpu left
        gpu_snapshot("c", gpus=8, resources={"cpu": ("64", "1", "0")}),
        gpu_snapshot("d", gpus=2, booked=(0, 1), resources={"cpu": ("16", "1", "0")}),  # full
    ]


def test_the_memo_gives_the_plan_without_it_for_every_seed_and_exclusion() -> None:
    nodes = _nodes()
    wanted = request(count=1, resources={"cpu": "4"})
    memo: NodeMemos = {}
    for seed in range(6):
        for excluded in (frozenset(), frozenset({"c"})):
            options = SchedulerOptions(seed=seed, excluded_nodes=excluded, top_n=2)
            assert plan_placement(wanted, pool(*nodes), options, memo) == plan_placement(
                wanted, pool(*nodes), options
            )
    (outcomes,) = memo.values()  # one request: one key
    assert set(outcomes) == {"a", "b", "c", "d"}
    assert isinstance(outcomes["b"][1], str) and isinstance(outcomes["d"][1], str)  # rejections too


def test_a_changed_node_snapshot_is_planned_again() -> None:
    nodes = _nodes()
    wanted = request(count=2, resources={"cpu": "4"})
    memo: NodeMemos = {}
    options = SchedulerOptions(top_n=1)
    first = plan_placement(wanted, pool(*nodes), options, memo)
    assert isinstance(first, Plan)
    # node a fills up: a new snapshot object, so its memoized candidate is not reused
    nodes[0] = replace(
        nodes[0], state=replace(nodes[0].state, booked=frozenset({"a-GPU0", "a-GPU1", "a-GPU2"}))
    )
    again = plan_placement(wanted, pool(*nodes), options, memo)
    assert again == plan_placement(wanted, pool(*nodes), options)
    assert isinstance(again, Plan) and "a" not in {c.node_id for c in again.ranked}
    everything_full = [
        replace(n, state=replace(n.state, booked=frozenset(a.id for a in n.inventory.atoms))) for n in nodes
    ]
    assert isinstance(plan_placement(wanted, pool(*everything_full), options, memo), Rejections)
