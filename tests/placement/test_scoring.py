"""Scorers (binpack, spread, topology, numa, plugin scorers clamped, weight overrides), count_score,
ranking ties on node id, the seeded topN pick, excluded nodes, admit hooks, and the pending summary."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pytest

from app.placement.model import Plan, Rejections
from app.placement.options import SchedulerOptions
from app.placement.pipeline import plan_placement
from app.placement.plugins import clamp_score, define_scheduler_plugin, load_plugins
from app.placement.scorers import DEFAULT_WEIGHTS, SCORER_NAMES, count_score, count_score_many
from app.placement.summary import summarize
from tests.factories import gpu_snapshot
from tests.placement.builders import DGX1, K80, RTX4090_8X, pool, request, topo_node

BUILTINS = ("binpack", "spread", "topology", "numa")


def _builtin(scores: Mapping[str, float]) -> dict[str, float]:
    """The built-in scorers' part of a mapping by scorer id (a scorer added to the registry is appended
    after them, docs/extending.md, and these tests hold without it)."""
    return {name: scores[name] for name in BUILTINS}


def test_registry_and_defaults() -> None:
    assert SCORER_NAMES[: len(BUILTINS)] == BUILTINS
    assert _builtin(DEFAULT_WEIGHTS) == {"binpack": 1.0, "spread": 0.0, "topology": 1.0, "numa": 0.5}


@pytest.mark.parametrize(
    ("gpus", "booked", "count", "binpack", "spread"),
    [
        (8, (), 1, 1 / 8, 1.0),
        (8, (0, 1, 2, 3), 2, 6 / 8, 0.5),
        (4, (0, 1, 2), 1, 1.0, 0.25),
        (4, (), 4, 1.0, 1.0),
    ],
)
def test_binpack_and_spread(
    gpus: int, booked: tuple[int, ...], count: int, binpack: float, spread: float
) -> None:
    plan = plan_placement(request(count=count), pool(gpu_snapshot(gpus=gpus, booked=booked)))
    assert isinstance(plan, Plan)
    assert plan.chosen.scores["binpack"] == pytest.approx(binpack)
    assert plan.chosen.scores["spread"] == pytest.approx(spread)
    busy = len(booked)
    assert count_score(gpus, busy, count) == pytest.approx(binpack)
    assert count_score(gpus, busy, count, {"spread": 0.5, "binpack": 0}) == pytest.approx(0.5 * spread)


def test_unhealthy_atoms_count_as_busy() -> None:
    plan = plan_placement(request(count=1), pool(gpu_snapshot(gpus=4, unavailable=(0,))))
    assert isinstance(plan, Plan) and plan.chosen.scores["binpack"] == 0.5


def test_count_score_many_is_the_mean() -> None:
    assert count_score_many([(8, 0, 8), (4, 0, 2)]) == pytest.approx((1.0 + 0.5) / 2)
    assert count_score_many([]) == 0.0
    assert count_score(0, 0, 1) == 0.0


@pytest.mark.parametrize(
    ("node_args", "count", "topology", "numa"),
    [
        ({"link": "NV12"}, 2, 1.0, 1.0),
        ({"link": "PIX"}, 2, 0.8, 1.0),
        ({"link": "PXB"}, 2, 0.6, 1.0),
        ({"link": "PHB"}, 2, 0.4, 1.0),
        ({"link": "NODE"}, 2, 0.2, 1.0),
        ({"link": "SYS"}, 2, 0.0, 1.0),
        ({"link": None}, 2, 0.5, 1.0),
        ({"link": None}, 1, 1.0, 1.0),
    ],
)
def test_topology_score_by_worst_link(
    node_args: dict[str, Any], count: int, topology: float, numa: float
) -> None:
    plan = plan_placement(request(count=count), pool(gpu_snapshot(**node_args)))
    assert isinstance(plan, Plan)
    assert plan.chosen.scores["topology"] == topology
    assert plan.chosen.scores["numa"] == numa


def test_numa_score_and_total() -> None:
    node = topo_node(RTX4090_8X)  # all SYS; NUMA 0 for GPU0-3, 1 for GPU4-7
    plan = plan_placement(request(count=6), pool(node))
    assert isinstance(plan, Plan)
    scores = plan.chosen.scores
    assert _builtin(scores) == {"binpack": 0.75, "spread": 1.0, "topology": 0.0, "numa": 0.5}
    assert plan.chosen.score == pytest.approx(sum(DEFAULT_WEIGHTS[name] * s for name, s in scores.items()))
    assert sum(DEFAULT_WEIGHTS[name] * scores[name] for name in BUILTINS) == pytest.approx(
        0.75 + 0.0 + 0.5 * 0.5
    )


def test_scalar_only_request() -> None:
    plan = plan_placement(
        request(count=0, resources={"cpu": "2"}), pool(gpu_snapshot(resources={"cpu": ("4", "1", "0")}))
    )
    assert isinstance(plan, Plan)
    assert plan.chosen.atoms == () and plan.chosen.resources == {"cpu": 2}
    assert _builtin(plan.chosen.scores) == {"binpack": 0.0, "spread": 0.0, "topology": 1.0, "numa": 1.0}


def test_ranking_prefers_binpack_then_node_id() -> None:
    nodes = [
        gpu_snapshot("node_c", booked=(0,)),
        gpu_snapshot("node_b"),
        gpu_snapshot("node_a"),
        gpu_snapshot("node_d", booked=(0, 1)),
    ]
    plan = plan_placement(request(count=1), pool(*nodes), SchedulerOptions(top_n=1))
    assert isinstance(plan, Plan)
    assert [c.node_id for c in plan.ranked] == ["node_d", "node_c", "node_a", "node_b"]
    assert plan.chosen.node_id == "node_d"


def test_weights_override_builtin_ids() -> None:
    nodes = [gpu_snapshot("node_a", booked=(0, 1)), gpu_snapshot("node_b")]
    options = SchedulerOptions(weights={"binpack": 0.0, "spread": 1.0}, top_n=1)
    plan = plan_placement(request(count=1), pool(*nodes), options)
    assert isinstance(plan, Plan) and plan.chosen.node_id == "node_b"


def test_topology_scorer_prefers_the_better_host() -> None:
    nodes = [topo_node(K80, node_id="node_a"), topo_node(DGX1, node_id="node_b")]
    plan = plan_placement(request(count=2), pool(*nodes), SchedulerOptions(weights={"binpack": 0}, top_n=1))
    assert isinstance(plan, Plan) and plan.chosen.node_id == "node_b"


RACK = define_scheduler_plugin(
    "rack-affinity",
    scorers=[
        {
            "id": "rack-a",
            "weight": 0.5,
            "score": lambda r, n: 1 if n.inventory.labels.get("rack", "").startswith("a") else 0,
        }
    ],
)


def test_plugin_scorer_weight_and_override() -> None:
    nodes = [gpu_snapshot("node_a", labels={"rack": "b1"}), gpu_snapshot("node_b", labels={"rack": "a1"})]
    plan = plan_placement(request(count=1), pool(*nodes), SchedulerOptions(plugins=(RACK,), top_n=1))
    assert isinstance(plan, Plan)
    assert plan.chosen.node_id == "node_b" and plan.chosen.scores["rack-a"] == 1
    assert plan.chosen.score == pytest.approx(0.25 + 1.0 + 0.5 + 0.5)
    options = SchedulerOptions(plugins=(RACK,), weights={"rack-a": 0}, top_n=1)
    plan = plan_placement(request(count=1), pool(*nodes), options)
    assert isinstance(plan, Plan) and plan.chosen.node_id == "node_a"


@pytest.mark.parametrize(
    ("raw", "clamped"),
    [(-1, 0.0), (0.25, 0.25), (7, 1.0), (math.nan, 0.0), ("x", 0.0), (None, 0.0), (True, 1.0)],
)
def test_plugin_scores_are_clamped(raw: Any, clamped: float) -> None:
    assert clamp_score(raw) == clamped
    plugin = define_scheduler_plugin("p", scorers=[{"id": "s", "score": lambda r, n: raw}])
    plan = plan_placement(request(), pool(gpu_snapshot()), SchedulerOptions(plugins=(plugin,)))
    assert isinstance(plan, Plan) and plan.chosen.scores["s"] == clamped


def test_seeded_top_n_pick() -> None:
    nodes = [gpu_snapshot(f"node_{i:02d}") for i in range(20)]  # all tie: ranked by node id
    chosen = set()
    for seed in range(40):
        options = SchedulerOptions(seed=seed, top_n=5)
        first = plan_placement(request(), pool(*nodes), options)
        again = plan_placement(request(), pool(*nodes), options)
        assert isinstance(first, Plan) and isinstance(again, Plan)
        assert first == again  # same seed, same plan
        assert first.chosen.node_id in [c.node_id for c in first.ranked[:5]]
        chosen.add(first.chosen.node_id)
        ranked = next(c for c in first.ranked if c.node_id == first.chosen.node_id)
        assert (first.chosen.score, first.chosen.scores) == (ranked.score, ranked.scores)
    assert chosen == {f"node_{i:02d}" for i in range(5)}
    plan = plan_placement(request(), pool(*nodes), SchedulerOptions(seed=3, top_n=100))
    assert isinstance(plan, Plan) and len(plan.ranked) == 20


def test_excluded_nodes_are_rejected_with_their_race() -> None:
    nodes = [gpu_snapshot("node_a"), gpu_snapshot("node_b")]
    options = SchedulerOptions(excluded_nodes=frozenset({"node_a"}), top_n=1)
    plan = plan_placement(request(), pool(*nodes), options)
    assert isinstance(plan, Plan) and plan.chosen.node_id == "node_b"
    assert plan.rejections == {"node_a": "excluded after a lost commit race"}
    options = SchedulerOptions(
        excluded_nodes=frozenset({"node_a", "node_b"}),
        exclusion_reasons={"node_a": "an atom on node_a was booked concurrently"},
    )
    result = plan_placement(request(), pool(*nodes), options)
    assert isinstance(result, Rejections)
    assert result.summary == (
        "no node fits (2 nodes): 1 × an atom on node_a was booked concurrently; "
        "1 × excluded after a lost commit race"
    )


def test_admit_hook() -> None:
    plugin = define_scheduler_plugin("gate", admit=lambda r: "spot is closed" if r.spot else None)
    assert isinstance(
        plan_placement(request(), pool(gpu_snapshot()), SchedulerOptions(plugins=(plugin,))), Plan
    )
    from dataclasses import replace

    result = plan_placement(
        replace(request(), spot=True), pool(gpu_snapshot()), SchedulerOptions(plugins=(plugin,))
    )
    assert result == Rejections(by_node={}, summary="admit gate: spot is closed")


def test_empty_and_archived_pools() -> None:
    assert plan_placement(request(), pool()) == Rejections(by_node={}, summary="the pool has no nodes")
    result = plan_placement(request(), pool(gpu_snapshot(), archived=True))
    assert result == Rejections(by_node={"node_a": "pool is archived"}, summary="the pool is archived")


SUMMARIES = [
    ({}, 0, "the pool has no nodes"),
    (
        {"a": "fits: 1 of 4 gpu free", "b": "fits: 1 of 4 gpu free", "c": "cordoned"},
        3,
        "no node fits (3 nodes): 2 × fits: 1 of 4 gpu free; 1 × cordoned",
    ),
    ({"a": "cordoned"}, 1, "no node fits (1 node): 1 × cordoned"),
    # ties break on the reason text
    ({"a": "b-reason", "b": "a-reason"}, 2, "no node fits (2 nodes): 1 × a-reason; 1 × b-reason"),
    # at most five groups, N counts every node
    (
        {str(i): f"r{i % 7}" for i in range(14)} | {"x": "r6"},
        15,
        "no node fits (15 nodes): 3 × r6; 2 × r0; 2 × r1; 2 × r2; 2 × r3",
    ),
]


@pytest.mark.parametrize(("by_node", "total", "summary"), SUMMARIES)
def test_summary(by_node: dict[str, str], total: int, summary: str) -> None:
    assert summarize(by_node, total) == summary


def test_pipeline_summary() -> None:
    nodes = [
        gpu_snapshot("a", booked=(0, 1, 2)),
        gpu_snapshot("b", booked=(1, 2, 3)),
        gpu_snapshot("c", reasons=("cordoned",)),
    ]
    result = plan_placement(request(count=2), pool(*nodes))
    assert isinstance(result, Rejections)
    assert result.summary == "no node fits (3 nodes): 2 × fits: 1 of 4 gpu free; 1 × cordoned"


RACK_PLUGIN = RACK


def test_load_plugins() -> None:
    assert [p.id for p in load_plugins(["tests.placement.test_scoring:RACK_PLUGIN"])] == ["rack-affinity"]
    for bad in [
        "nocolon",
        "tests.placement.test_scoring:missing",
        "no.such.module:x",
        "tests.placement.test_scoring:SUMMARIES",
    ]:
        with pytest.raises(ValueError):
            load_plugins([bad])


def test_define_scheduler_plugin_validates() -> None:
    with pytest.raises(ValueError):
        define_scheduler_plugin("")
    with pytest.raises(ValueError):
        define_scheduler_plugin("p", scorers=[{"id": "s", "score": abs}, {"id": "s", "score": abs}])
    with pytest.raises(ValueError):
        define_scheduler_plugin("p", filters=[{"filter": abs}])


def test_the_chosen_atoms_vary_with_the_seed_among_tied_sets_only() -> None:
    """Two concurrent 1-GPU placements on one node should rarely reach for the same atom: the chosen
    node's set is drawn (seeded) among the sets the greedy pick ties on, with the same scores."""
    node = gpu_snapshot("solo")
    picked = set()
    for seed in range(64):
        plan = plan_placement(request(), pool(node), SchedulerOptions(seed=seed))
        assert isinstance(plan, Plan)
        assert plan == plan_placement(request(), pool(node), SchedulerOptions(seed=seed))
        assert plan.chosen.scores == plan.ranked[0].scores
        picked.add(plan.chosen.atoms)
    assert len(picked) > 1
