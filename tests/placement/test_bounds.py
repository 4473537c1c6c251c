"""The shortlist's pick-score ceiling is a true upper bound and tight on uniform pools."""

from __future__ import annotations

import itertools
import random

from app.placement.bounds import pick_score_ceiling
from app.placement.model import Atom, DeviceRequest, NodeInventory
from app.placement.topology import LINK_SCORES, class_topology, scored_set

LINKS = ["NV12", "PIX", "PXB", "PHB", "NODE", "SYS", None]


def _node(name: str, rng: random.Random, gpus: int) -> NodeInventory:
    atoms = tuple(Atom(f"{name}-GPU{i}", "gpu", {}, rng.choice([0, 1, None])) for i in range(gpus))
    links = {}
    for a, b in itertools.combinations([x.id for x in atoms], 2):
        kind = rng.choice(LINKS)
        if kind:
            links[(a, b)] = kind
    return NodeInventory(name, name, atoms=atoms, links=links)


def test_ceiling_bounds_every_subset_of_random_nodes() -> None:
    rng = random.Random(7)
    for trial in range(40):
        node = _node(f"t{trial}", rng, rng.choice([2, 3, 4, 6]))
        topo = class_topology("gpu", list(node.atoms), node.links)
        n = len(topo.atom_ids)
        for count in range(1, n + 1):
            ceiling = pick_score_ceiling([node], (DeviceRequest("gpu", count),))
            best = max(
                1.0 * s.topology_score + 0.5 * s.numa_score
                for s in (scored_set(topo, idx) for idx in itertools.combinations(range(n), count))
            )
            assert best <= ceiling + 1e-12, (trial, count)


def test_ceiling_is_tight_for_a_two_socket_nvlink_host() -> None:
    atoms = tuple(Atom(f"d-GPU{i}", "gpu", {}, i // 4) for i in range(8))
    links = {(a.id, b.id): "NV12" for a, b in itertools.combinations(atoms, 2)}
    node = NodeInventory("d", "d", atoms=atoms, links=links)
    assert pick_score_ceiling([node], (DeviceRequest("gpu", 8),)) == 1.0 + 0.5 * 0.5
    assert pick_score_ceiling([node], (DeviceRequest("gpu", 4),)) == 1.5
    assert pick_score_ceiling([node], (DeviceRequest("gpu", 9),)) == 0.0
    assert pick_score_ceiling([node], (), {"topology": 2.0}) == 2.5
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
    assert pick_score_ceiling([node], (DeviceRequest("gpu", 8),)) == 0.0 + 0.5
    assert pick_score_ceiling([node], (DeviceRequest("gpu", 4),)) == 1.5  # an NV-complete quad exists
