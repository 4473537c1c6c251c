"""The scorer contract (issue 16): a scorer without declarations fails registration; the weights, the
count-only key, the bound and the shared-score key are derived from the declarations, so a toy scorer
added in a test is ranked, bounded and shared correctly without touching any other file."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import pytest

from app.placement.bounds import pick_score_ceiling
from app.placement.context import NodeWork, PlanContext
from app.placement.derived import free, matches
from app.placement.model import DeviceRequest, NodeInventory, NodeSnapshot, NodeState, Plan
from app.placement.options import SchedulerOptions
from app.placement.pipeline import plan_placement
from app.placement.scorers import DEFAULT_WEIGHTS, SCORERS, binpack, numa, spread, topology
from app.placement.scorers.contract import COUNTS, NODE, PICK, ScorerDeclarationError, ScorerSet
from tests.factories import gpu_snapshot
from tests.placement.builders import pool, request
from tests.placement.test_bounds import _node

# A pick-dependent toy scorer: prefers picks holding low-index atoms (which the built-ins ignore).
LOW_FIRST = SimpleNamespace(
    NAME="toy-lowfirst",
    DEFAULT_WEIGHT=2.0,
    DEPENDS=PICK,
    share=lambda pick: 1.0 / (1 + min(pick.indices, default=0)),
)
# A count-only toy scorer: prefers nodes with more atoms of the class.
BIG_HOST = SimpleNamespace(
    NAME="toy-bighost", DEFAULT_WEIGHT=1.0, DEPENDS=COUNTS, share=lambda t, busy, r: t / 16
)
# A node-dependent toy scorer (as a plugin scorer would be).
BY_NAME = SimpleNamespace(
    NAME="toy-byname", DEFAULT_WEIGHT=1.0, DEPENDS=NODE, score=lambda ctx, work: (len(work.node.name) % 7) / 7
)


@pytest.mark.parametrize(
    ("module", "message"),
    [
        (SimpleNamespace(NAME="x", DEFAULT_WEIGHT=1.0, share=lambda *a: 0.0), "declares no DEPENDS"),
        (SimpleNamespace(DEFAULT_WEIGHT=1.0, DEPENDS=PICK, share=lambda p: 0.0), "declares no NAME"),
        (SimpleNamespace(NAME="x", DEPENDS=PICK, share=lambda p: 0.0), "declares no DEFAULT_WEIGHT"),
        (SimpleNamespace(NAME="x", DEFAULT_WEIGHT=1.0, DEPENDS="free"), "DEPENDS is 'free'"),
        (SimpleNamespace(NAME="x", DEFAULT_WEIGHT=1.0, DEPENDS=COUNTS), "has no share()"),
        (
            SimpleNamespace(NAME="x", DEFAULT_WEIGHT=1.0, DEPENDS=PICK, score=lambda c, w: 0.0),
            "has no share()",
        ),
        (SimpleNamespace(NAME="x", DEFAULT_WEIGHT=1.0, DEPENDS=NODE, share=lambda p: 0.0), "has no score()"),
        (SimpleNamespace(NAME="binpack", DEFAULT_WEIGHT=1.0, DEPENDS=COUNTS, share=lambda *a: 0.0), "repeat"),
    ],
)
def test_a_scorer_without_declarations_fails_registration(module: SimpleNamespace, message: str) -> None:
    with pytest.raises(ScorerDeclarationError, match=message):
        SCORERS.adding(module)


def test_the_registry_declares_every_builtin() -> None:
    # the built-ins first, in this order; a scorer added to the registry is appended (docs/extending.md)
    builtins = (binpack, spread, topology, numa)
    assert [(s.name, s.depends) for s in SCORERS.scorers[: len(builtins)]] == [
        ("binpack", COUNTS),
        ("spread", COUNTS),
        ("topology", PICK),
        ("numa", PICK),
    ]
    assert {m.NAME: DEFAULT_WEIGHTS[m.NAME] for m in builtins} == {m.NAME: m.DEFAULT_WEIGHT for m in builtins}
    assert ScorerSet.of(*builtins).scorers == SCORERS.scorers[: len(builtins)]


def test_the_count_key_is_the_counts_scorers_part_of_the_pipeline_score() -> None:
    scorers = SCORERS.adding(BIG_HOST, LOW_FIRST)
    options = SchedulerOptions(scorers=scorers, weights={"spread": 0.5})
    for gpus, booked, count in [(8, (), 1), (8, (0, 1, 2), 3), (4, (1,), 2), (2, (), 2)]:
        plan = plan_placement(request(count=count), pool(gpu_snapshot(gpus=gpus, booked=booked)), options)
        assert isinstance(plan, Plan)
        scores = plan.chosen.scores
        counts = sum(
            options.weight(s.name, s.default_weight) * scores[s.name] for s in scorers.of_kind(COUNTS)
        )
        assert scorers.count_score_many([(gpus, len(booked), count)], options.weights) == pytest.approx(
            counts
        )
        assert scores["toy-bighost"] == gpus / 16 and "toy-lowfirst" in scores


def test_the_bound_covers_a_pick_dependent_toy_scorer() -> None:
    rng = random.Random(16)
    scorers = SCORERS.adding(LOW_FIRST)
    options = SchedulerOptions(scorers=scorers)
    for trial in range(30):
        nodes = [_node(f"t{trial}-{i}", rng, rng.choice([2, 3, 4, 6])) for i in range(3)]
        for count in (1, 2, 3):
            devices = (DeviceRequest("gpu", count),)
            ceiling = pick_score_ceiling(nodes, devices, scorers=scorers)
            for inventory in nodes:
                for booked in itertools.combinations(range(len(inventory.atoms)), rng.choice([0, 1])):
                    snapshot = gpu_node_from(inventory, booked)
                    plan = plan_placement(request(count=count), pool(snapshot), options)
                    if not isinstance(plan, Plan):
                        continue
                    part = sum(
                        options.weight(s.name, s.default_weight) * plan.chosen.scores[s.name]
                        for s in scorers.of_kind(PICK)
                    )
                    assert part <= ceiling + 1e-12, (trial, count, inventory.id, booked)


def gpu_node_from(inventory: NodeInventory, booked: tuple[int, ...]) -> NodeSnapshot:
    return NodeSnapshot(inventory, NodeState(booked=frozenset(inventory.atoms[i].id for i in booked)))


def test_the_share_key_is_derived_from_the_kinds() -> None:
    assert SCORERS.share_key(1, plugin_pickers=False) is not None
    assert SCORERS.share_key(1, plugin_pickers=True) is None  # a plugin picker reads the node
    assert SCORERS.adding(BY_NAME).share_key(1, plugin_pickers=False) is None
    only_counts = ScorerSet.of(binpack, spread)
    node = gpu_snapshot(gpus=4, booked=(0,))
    ctx = PlanContext.build(request(count=1), pool(node), SchedulerOptions())
    work = NodeWork(node, 1)
    matches(ctx, work)
    free(ctx, work)
    key = only_counts.share_key(1, plugin_pickers=False)
    assert key is not None and key(work) == (work.classes[0].signature, work.available_masks[0])  # type: ignore[union-attr]


def test_a_node_dependent_scorer_is_not_shared_between_alike_nodes() -> None:
    # Two alike nodes (same links, same free atoms) whose names differ: a NODE scorer sees the names.
    options = SchedulerOptions(scorers=SCORERS.adding(BY_NAME), top_n=1)
    plan = plan_placement(
        request(count=1), pool(gpu_snapshot("a", gpus=4), gpu_snapshot("abc", gpus=4)), options
    )
    assert isinstance(plan, Plan)
    assert {c.node_id: c.scores["toy-byname"] for c in plan.ranked} == {"a": 1 / 7, "abc": 3 / 7}
