"""The shortlist's pick-score ceiling is a true upper bound and tight on uniform pools.

The expected values are derived from the scorer registry (every ``PICK`` scorer at its default weight,
tried on every subset), so a scorer added to the registry is held to the same bound without editing
this file (docs/extending.md); the built-ins' own numbers are pinned on a set of their own."""

from __future__ import annotations

import itertools
import json
import random
from math import comb
from pathlib import Path

from app.placement.bounds import EXACT_SUBSETS, pick_score_ceiling
from app.placement.model import Atom, DeviceRequest, NodeInventory
from app.placement.scorers import SCORERS, numa, topology
from app.placement.scorers.contract import PICK, ScorerSet
from app.placement.topology import class_topology, scored_set

LINKS = ["NV12", "PIX", "PXB", "PHB", "NODE", "SYS", None]
BUILTIN_PICK = ScorerSet.of(topology, numa)  # the built-in PICK scorers alone (weights 1.0 and 0.5)


def _node(name: str, rng: random.Random, gpus: int) -> NodeInventory:
    atoms = tuple(Atom(f"{name}-GPU{i}", "gpu", {}, rng.choice([0, 1, None])) for i in range(gpus))
    links = {}
    for a, b in itertools.combinations([x.id for x in atoms], 2):
        kind = rng.choice(LINKS)
        if kind:
            links[(a, b)] = kind
    return NodeInventory(name, name, atoms=atoms, links=links)


def best_pick_score(node: NodeInventory, count: int, scorers: ScorerSet = SCORERS) -> float:
    """The most the ``PICK`` scorers of ``scorers`` (default weights) score on any ``count`` atoms of
    ``node``: tried on every subset."""
    topo = class_topology("gpu", list(node.atoms), node.links)
    weighted = [(s, max(0.0, scorers.weight(s, {}))) for s in scorers.of_kind(PICK)]
    return max(
        sum(w * s.share(pick) for s, w in weighted)
        for pick in (scored_set(topo, idx) for idx in itertools.combinations(range(len(node.atoms)), count))
    )


def test_ceiling_bounds_every_subset_of_random_nodes() -> None:
    rng = random.Random(7)
    for trial in range(40):
        node = _node(f"t{trial}", rng, rng.choice([2, 3, 4, 6]))
        for count in range(1, len(node.atoms) + 1):
            ceiling = pick_score_ceiling([node], (DeviceRequest("gpu", count),))
            assert best_pick_score(node, count) <= ceiling + 1e-12, (trial, count)


def test_declared_ceilings_bound_every_subset_of_big_nodes() -> None:
    # 12 atoms, 5 or 6 picked: more than EXACT_SUBSETS subsets, so the bound is the sum of the
    # scorers' declared ceilings (1.0 for a scorer that declares none), which must hold too
    rng = random.Random(11)
    for trial in range(6):
        node = _node(f"b{trial}", rng, 12)
        for count in (5, 6):
            assert comb(12, count) > EXACT_SUBSETS
            ceiling = pick_score_ceiling([node], (DeviceRequest("gpu", count),))
            assert best_pick_score(node, count) <= ceiling + 1e-12, (trial, count)


def _two_socket_nvlink_host() -> NodeInventory:
    atoms = tuple(Atom(f"d-GPU{i}", "gpu", {}, i // 4) for i in range(8))
    links = {(a.id, b.id): "NV12" for a, b in itertools.combinations(atoms, 2)}
    return NodeInventory("d", "d", atoms=atoms, links=links)


def _dgx1() -> NodeInventory:
    data = Path(__file__).parent.parent / "data" / "topo"
    expected = json.loads((data / "01-dgx1-v100-hybrid-cube-mesh-mlx5.expected.json").read_text())
    atoms = tuple(Atom(f"x-{g}", "gpu", {}, None) for g in expected["gpus"])
    links = {}
    for pair, kind in expected["gpu_links"].items():
        a, b = pair.split("-")
        links[tuple(sorted((f"x-{a}", f"x-{b}")))] = kind
    return NodeInventory("x", "x", atoms=atoms, links=links)


def test_ceiling_is_the_registrys_best_on_hosts_of_eight() -> None:
    # up to EXACT_SUBSETS subsets the ceiling is exact: the best the registry's PICK scorers reach
    for node in (_two_socket_nvlink_host(), _dgx1()):
        for count in (1, 2, 4, 8):
            assert pick_score_ceiling([node], (DeviceRequest("gpu", count),)) == best_pick_score(node, count)
        assert pick_score_ceiling([node], (DeviceRequest("gpu", 9),)) == 0.0


def test_ceiling_is_tight_for_a_two_socket_nvlink_host() -> None:
    node = _two_socket_nvlink_host()
    assert pick_score_ceiling([node], (DeviceRequest("gpu", 8),), scorers=BUILTIN_PICK) == 1.0 + 0.5 * 0.5
    assert pick_score_ceiling([node], (DeviceRequest("gpu", 4),), scorers=BUILTIN_PICK) == 1.5
    assert pick_score_ceiling([node], (DeviceRequest("gpu", 9),), scorers=BUILTIN_PICK) == 0.0
    assert pick_score_ceiling([node], (), {"topology": 2.0}, scorers=BUILTIN_PICK) == 2.5


def test_ceiling_is_exact_on_a_dgx1_hybrid_cube_mesh() -> None:
    """On a DGX-1 no 8-GPU set is NVLink-complete: the ceiling says so (worst link SYS -> 0)."""
    node = _dgx1()
    assert pick_score_ceiling([node], (DeviceRequest("gpu", 8),), scorers=BUILTIN_PICK) == 0.0 + 0.5
    assert pick_score_ceiling([node], (DeviceRequest("gpu", 4),), scorers=BUILTIN_PICK) == 1.5  # NV quad
