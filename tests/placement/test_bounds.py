"""The shortlist's pick-score ceiling is a true upper bound and tight on uniform pools.

The bound test derives what it expects from the registry (every ``PICK`` scorer of ``SCORERS``, at its
default weight and at weight 1.0), so a newly registered scorer is checked, not a reason to edit this
file (docs/extending.md). The tightness tests pin the built-in ``topology`` and ``numa`` scorers on
purpose: their numbers are those two scorers' values."""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping

import pytest

from app.placement.bounds import EXACT_SUBSETS, pick_score_ceiling
from app.placement.model import Atom, DeviceRequest, NodeInventory
from app.placement.scorers import DEFAULT_WEIGHTS, SCORERS, numa, topology
from app.placement.scorers.contract import PICK, ScorerSet
from app.placement.topology import LINK_SCORES, class_topology, scored_set

LINKS: list[str | None] = ["NV12", "PIX", "PXB", "PHB", "NODE", "SYS", None]
DENSE: list[str | None] = ["NV12"] * 12 + ["PIX", "SYS"]  # mostly NVLink: the best subsets score high
BUILTIN_PICK = ScorerSet.of(topology, numa)  # the scorers the tightness numbers below are about


def _node(name: str, rng: random.Random, gpus: int, kinds: list[str | None] = LINKS) -> NodeInventory:
    atoms = tuple(Atom(f"{name}-GPU{i}", "gpu", {}, rng.choice([0, 1, None])) for i in range(gpus))
    links = {}
    for a, b in itertools.combinations([x.id for x in atoms], 2):
        kind = rng.choice(kinds)
        if kind:
            links[(a, b)] = kind
    return NodeInventory(name, name, atoms=atoms, links=links)


def _best_pick_score(
    node: NodeInventory, count: int, scorers: ScorerSet, weights: Mapping[str, float]
) -> float:
    """The best weighted sum of ``scorers``' ``PICK`` shares over every subset of ``count`` GPUs."""
    topo = class_topology("gpu", list(node.atoms), node.links)
    weighted = [(s, max(0.0, scorers.weight(s, weights))) for s in scorers.of_kind(PICK)]
    return max(
        sum(w * s.share(picked) for s, w in weighted)
        for picked in (
            scored_set(topo, idx) for idx in itertools.combinations(range(len(topo.atom_ids)), count)
        )
    )


WEIGHTINGS = {
    "defaults": dict(DEFAULT_WEIGHTS),
    "every-pick-scorer-at-1": {s.name: 1.0 for s in SCORERS.of_kind(PICK)},
}


@pytest.mark.parametrize("weights", WEIGHTINGS.values(), ids=WEIGHTINGS.keys())
def test_ceiling_bounds_every_subset_of_random_nodes(weights: Mapping[str, float]) -> None:
    rng = random.Random(7)
    for trial in range(40):
        node = _node(f"t{trial}", rng, rng.choice([2, 3, 4, 6]))
        for count in range(1, len(node.atoms) + 1):
            ceiling = pick_score_ceiling([node], (DeviceRequest("gpu", count),), weights)
            best = _best_pick_score(node, count, SCORERS, weights)
            assert best <= ceiling + 1e-12, (trial, count)


@pytest.mark.parametrize("weights", WEIGHTINGS.values(), ids=WEIGHTINGS.keys())
def test_declared_ceilings_bound_every_subset_of_big_random_nodes(weights: Mapping[str, float]) -> None:
    # 12 GPUs, 5 to 7 of them: more subsets than EXACT_SUBSETS, so the bound is each scorer's declared
    # ``ceiling`` (1.0 when it declares none), checked here against the best subset
    rng = random.Random(11)
    for trial in range(3):
        node = _node(f"big{trial}", rng, 12, DENSE)
        for count in (5, 6, 7):
            assert len(list(itertools.combinations(range(12), count))) > EXACT_SUBSETS
            ceiling = pick_score_ceiling([node], (DeviceRequest("gpu", count),), weights)
            best = _best_pick_score(node, count, SCORERS, weights)
            assert best <= ceiling + 1e-12, (trial, count)


def test_ceiling_is_tight_for_a_two_socket_nvlink_host() -> None:
    atoms = tuple(Atom(f"d-GPU{i}", "gpu", {}, i // 4) for i in range(8))
    links = {(a.id, b.id): "NV12" for a, b in itertools.combinations(atoms, 2)}
    node = NodeInventory("d", "d", atoms=atoms, links=links)
    assert pick_score_ceiling([node], (DeviceRequest("gpu", 8),), scorers=BUILTIN_PICK) == 1.0 + 0.5 * 0.5
    assert pick_score_ceiling([node], (DeviceRequest("gpu", 4),), scorers=BUILTIN_PICK) == 1.5
    assert pick_score_ceiling([node], (DeviceRequest("gpu", 9),), scorers=BUILTIN_PICK) == 0.0
    assert pick_score_ceiling([node], (), {"topology": 2.0}, scorers=BUILTIN_PICK) == 2.5
    assert LINK_SCORES  # the scores the ceiling reads


def test_ceiling_is_exact_on_a_dgx1_hybrid_cube_mesh() -> None:
    """On a DGX-1 no 8-GPU set is NVLink-complete: the ceiling says so (worst link SYS -> 0)."""
    import json
    from pathlib import Path

    expected = json.loads(
        (
            Path(__file__).parent.parent
            / "data"
            / "topo"
            / "01-dgx1-v100-hybrid-cube-mesh-mlx5.expected.json"
        ).read_text()
    )
    atoms = tuple(Atom(f"x-{g}", "gpu", {}, None) for g in expected["gpus"])
    links = {}
    for pair, kind in expected["gpu_links"].items():
        a, b = pair.split("-")
        links[tuple(sorted((f"x-{a}", f"x-{b}")))] = kind
    node = NodeInventory("x", "x", atoms=atoms, links=links)
    assert pick_score_ceiling([node], (DeviceRequest("gpu", 8),), scorers=BUILTIN_PICK) == 0.0 + 0.5
    assert (
        pick_score_ceiling([node], (DeviceRequest("gpu", 4),), scorers=BUILTIN_PICK) == 1.5
    )  # an NV-complete quad exists
