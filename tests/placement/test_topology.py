"""Every pick rule on the real topology matrices of tests/data/topo (the expected parses' gpu_links and
numa_affinity): NVLink-complete sets first, then NUMA spread, the same-NUMA tie-break, unknown links
below SYS, MIG slices as NV, nvlink-all rejection, and memoization across alike nodes."""

from __future__ import annotations

import pytest

from app.placement.model import Atom, DeviceRequest, NodeInventory, NodeSnapshot, NodeState, Plan, Rejections
from app.placement.pipeline import plan_placement
from app.placement.scorers import topology as topology_scorer
from app.placement.scorers.topology import LINK_SCORES
from app.placement.topology import (
    NODE,
    NV,
    PHB,
    PIX,
    PXB,
    SYS,
    UNKNOWN,
    class_topology,
    greedy_pick,
    link_rank,
    node_topology,
    pick,
    scored_set,
)
from tests.placement.builders import (
    A100_4X,
    A6000_3X,
    DGX1,
    DGX_A100,
    DGX_H100,
    K80,
    NV4_4GPU,
    RTX4090_8X,
    pool,
    request,
    topo_node,
)

DGX1_NUMA = {f"GPU{i}": i // 4 for i in range(8)}


def picked(node: NodeSnapshot, count: int, topology: str | None = None) -> tuple[int, ...] | str:
    """The GPU indices the pipeline picks on ``node``, or the rejection reason."""
    result = plan_placement(request(count=count, topology=topology), pool(node))
    if isinstance(result, Rejections):
        return result.by_node[node.id]
    assert isinstance(result, Plan)
    return tuple(int(a.rsplit("GPU", 1)[1]) for a in result.ranked[0].atoms)  # the greedy pick itself


@pytest.mark.parametrize(
    ("text", "rank"),
    [
        ("NV1", NV),
        ("NV12", NV),
        ("NV18", NV),
        (" nv4 ", NV),
        ("PIX", PIX),
        ("PXB", PXB),
        ("PHB", PHB),
        ("NODE", NODE),
        ("SYS", SYS),
        ("SOC", SYS),
        ("X", UNKNOWN),
        ("NVX", UNKNOWN),
        ("", UNKNOWN),
        (None, UNKNOWN),
    ],
)
def test_link_rank(text: str | None, rank: int) -> None:
    assert link_rank(text) == rank


@pytest.mark.parametrize(
    ("better", "worse"),
    [("NV12", "PIX"), ("PIX", "PXB"), ("PXB", "PHB"), ("PHB", "NODE"), ("NODE", "SYS"), ("SYS", "bogus")],
)
def test_the_pick_prefers_the_better_link(better: str, worse: str) -> None:
    # The order of links is what the pick does with it: of GPU0-GPU1 joined by ``worse`` and GPU1-GPU2
    # by ``better`` (GPU0-GPU2 unknown), a pick of two takes the better pair, and scores its link.
    atoms = [Atom(f"g{i}", "gpu", {}, 0) for i in range(3)]
    ct = class_topology("gpu", atoms, {("g0", "g1"): worse, ("g1", "g2"): better})
    chosen = pick(ct, ct.full_mask, 2)
    assert [ct.atom_ids[i] for i in chosen.indices] == ["g1", "g2"]
    assert chosen.worst_link == link_rank(better)
    assert topology_scorer.share(chosen) == LINK_SCORES[link_rank(better)]


PICKS = [
    # (case, fixture, numa override, booked, count, topology, expected GPU indices or reason)
    ("dgx1 4 nvlink-all: an NV-complete quad", DGX1, DGX1_NUMA, (), 4, "nvlink-all", (0, 1, 2, 3)),
    ("dgx1 4 nvlink-all, NUMA unknown", DGX1, None, (), 4, "nvlink-all", (0, 1, 2, 3)),
    (
        "dgx1 8 nvlink-all is rejected",
        DGX1,
        DGX1_NUMA,
        (),
        8,
        "nvlink-all",
        "topology: no NVLink-complete set of 8 gpu",
    ),
    (
        "dgx1 5 nvlink-all is rejected",
        DGX1,
        DGX1_NUMA,
        (),
        5,
        "nvlink-all",
        "topology: no NVLink-complete set of 5 gpu",
    ),
    ("dgx1 8 without nvlink-all takes all", DGX1, DGX1_NUMA, (), 8, None, (0, 1, 2, 3, 4, 5, 6, 7)),
    ("dgx1 4 with GPU0 booked: the other quad", DGX1, DGX1_NUMA, (0,), 4, "nvlink-all", (4, 5, 6, 7)),
    ("dgx1 3 with GPU0 booked: an NV triangle", DGX1, DGX1_NUMA, (0,), 3, "nvlink-all", (1, 2, 3)),
    (
        "dgx1 4 with GPU0 and GPU4 booked: no NV quad left",
        DGX1,
        DGX1_NUMA,
        (0, 4),
        4,
        "nvlink-all",
        "topology: no NVLink-complete set of 4 gpu",
    ),
    ("dgx1 4 with GPU0 and GPU4 booked, no nvlink-all", DGX1, DGX1_NUMA, (0, 4), 4, None, (1, 2, 3, 5)),
    ("dgx1 2 with the first quad booked", DGX1, DGX1_NUMA, (0, 1, 2, 3), 2, "nvlink-all", (4, 5)),
    ("dgx1 1 GPU: the lowest id", DGX1, DGX1_NUMA, (), 1, "nvlink-all", (0,)),
    # all-NV hosts: the fewest NUMA nodes decides
    ("h100 4: one NUMA node", DGX_H100, None, (), 4, "nvlink-all", (0, 1, 2, 3)),
    ("h100 4 with GPU0,1 booked: the other socket", DGX_H100, None, (0, 1), 4, None, (4, 5, 6, 7)),
    ("h100 2 with GPU1-3 booked: a pair on one NUMA node", DGX_H100, None, (1, 2, 3), 2, None, (4, 5)),
    ("h100 5 spans two NUMA nodes", DGX_H100, None, (), 5, "nvlink-all", (0, 1, 2, 3, 4)),
    ("a100 NPS4: a pair on one NUMA node", DGX_A100, None, (), 2, None, (0, 1)),
    ("a100 NPS4: 2 with GPU0 booked", DGX_A100, None, (0,), 2, None, (2, 3)),
    ("a100 NPS4: 4 spans two", DGX_A100, None, (), 4, None, (0, 1, 2, 3)),
    ("4x a100 reversed NUMA", A100_4X, None, (), 4, "nvlink-all", (0, 1, 2, 3)),
    ("4 gpu NV4, two NUMA", NV4_4GPU, None, (0,), 2, None, (2, 3)),
    # PCIe hosts
    ("k80 pair on one switch", K80, None, (), 2, None, (0, 1)),
    ("k80 pair with GPU0 booked: the other switch", K80, None, (0,), 2, None, (2, 3)),
    (
        "k80 nvlink-all is rejected",
        K80,
        None,
        (),
        2,
        "nvlink-all",
        "topology: no NVLink-complete set of 2 gpu",
    ),
    ("a6000 NV pair beats NODE", A6000_3X, None, (), 2, "nvlink-all", (0, 1)),
    ("a6000 with GPU0 booked: NODE pair", A6000_3X, None, (0,), 2, None, (1, 2)),
    (
        "a6000 with GPU0 booked, nvlink-all",
        A6000_3X,
        None,
        (0,),
        2,
        "nvlink-all",
        "topology: no NVLink-complete set of 2 gpu",
    ),
    ("rtx4090 all SYS: NUMA decides", RTX4090_8X, None, (0, 1, 2), 2, None, (4, 5)),
    (
        "rtx4090 nvlink-all is rejected",
        RTX4090_8X,
        None,
        (),
        2,
        "nvlink-all",
        "topology: no NVLink-complete set of 2 gpu",
    ),
]


@pytest.mark.parametrize(
    ("case", "fixture", "numa", "booked", "count", "topology", "expected"), PICKS, ids=[p[0] for p in PICKS]
)
def test_pick_on_real_matrices(
    case: str,
    fixture: str,
    numa: dict[str, int | None] | None,
    booked: tuple[int, ...],
    count: int,
    topology: str | None,
    expected: tuple[int, ...] | str,
) -> None:
    assert picked(topo_node(fixture, numa=numa, booked=booked), count, topology) == expected


def test_same_numa_as_seed_breaks_ties() -> None:
    # all NV18; GPU1 moved to NUMA 1: from seed 0 the tie between GPU1, GPU2, GPU3 goes to GPU2
    numa = {"GPU0": 0, "GPU1": 1, "GPU2": 0, "GPU3": 0, "GPU4": 1, "GPU5": 1, "GPU6": 1, "GPU7": 1}
    assert picked(topo_node(DGX_H100, numa=numa), 2) == (0, 2)


def test_best_worst_link_beats_numa_spread() -> None:
    # GPU0-1 NV on different NUMA nodes, GPU0-2 PIX on one NUMA node: NV wins
    ranks = ((NV, NV, PIX), (NV, NV, SYS), (PIX, SYS, NV))
    assert greedy_pick(ranks, (0, 1, 0), [0, 1, 2], 2).indices == (0, 1)
    # equal worst link: the smaller NUMA spread wins even over lower ids
    ranks = ((NV, PIX, PIX), (PIX, NV, PIX), (PIX, PIX, NV))
    assert greedy_pick(ranks, (0, 1, 1), [0, 1, 2], 2).indices == (1, 2)


def test_unknown_links_rank_below_sys() -> None:
    atoms = tuple(Atom(id=f"n-GPU{i}", device_class="gpu", numa_node=0) for i in range(3))
    links = {("n-GPU0", "n-GPU2"): "SYS", ("n-GPU1", "n-GPU2"): "SYS"}  # GPU0-GPU1 unknown
    node = NodeSnapshot(NodeInventory(id="n", name="n", atoms=atoms, links=links), NodeState())
    assert picked(node, 2) == (0, 2)
    plan = plan_placement(request(count=3), pool(node))
    assert isinstance(plan, Plan) and plan.chosen.scores["topology"] == 0.5  # any unknown link: neutral


def mig_node(gpu_link: str | None) -> NodeSnapshot:
    atoms = (
        Atom(id="MIG-a1", device_class="mig", parent="GPU-A", numa_node=0),
        Atom(id="MIG-a2", device_class="mig", parent="GPU-A", numa_node=0),
        Atom(id="MIG-b1", device_class="mig", parent="GPU-B", numa_node=0),
    )
    links = {("GPU-A", "GPU-B"): gpu_link} if gpu_link else {}
    return NodeSnapshot(NodeInventory(id="m", name="m", atoms=atoms, links=links), NodeState())


def test_mig_slices_of_one_gpu_are_nv() -> None:
    plan = plan_placement(request(count=2, device_class="mig", topology="nvlink-all"), pool(mig_node(None)))
    assert isinstance(plan, Plan) and plan.chosen.atoms == ("MIG-a1", "MIG-a2")
    assert plan.chosen.scores["topology"] == 1.0


def test_mig_slices_take_their_parents_link() -> None:
    topology = node_topology(mig_node("SYS").inventory).classes["mig"]
    assert topology.ranks[0][2] == SYS and topology.ranks[0][1] == NV
    result = plan_placement(
        request(count=3, device_class="mig", topology="nvlink-all"), pool(mig_node("SYS"))
    )
    assert isinstance(result, Rejections)
    assert result.by_node["m"] == "topology: no NVLink-complete set of 3 mig"
    plan = plan_placement(request(count=3, device_class="mig", topology="nvlink-all"), pool(mig_node("NV6")))
    assert isinstance(plan, Plan) and plan.ranked[0].atoms == ("MIG-a1", "MIG-a2", "MIG-b1")


def test_atoms_are_ordered_by_id_for_the_tie_break() -> None:
    atoms = tuple(Atom(id=f"GPU-{c}", device_class="gpu", numa_node=0) for c in "dcba")
    links = {(f"GPU-{a}", f"GPU-{b}"): "NV4" for a in "abcd" for b in "abcd" if a < b}
    node = NodeSnapshot(NodeInventory(id="n", name="n", atoms=atoms, links=links), NodeState())
    plan = plan_placement(request(count=2), pool(node))
    assert isinstance(plan, Plan) and plan.ranked[0].atoms == ("GPU-a", "GPU-b")


def test_picks_are_shared_between_alike_nodes() -> None:
    a = node_topology(topo_node(DGX1, node_id="node_a", numa=DGX1_NUMA).inventory).classes["gpu"]
    b = node_topology(topo_node(DGX1, node_id="node_b", numa=DGX1_NUMA).inventory).classes["gpu"]
    c = node_topology(topo_node(DGX1, node_id="node_c").inventory).classes["gpu"]  # NUMA unknown
    assert a.signature == b.signature != c.signature
    assert pick(a, a.full_mask, 4) is pick(b, b.full_mask, 4)


def test_node_topology_is_cached_per_inventory_object() -> None:
    node = topo_node(DGX_H100)
    assert node_topology(node.inventory) is node_topology(node.inventory)


def test_several_requests_of_one_class_never_share_atoms() -> None:
    node = topo_node(DGX1, numa=DGX1_NUMA)
    devices = (DeviceRequest("gpu", 4, None, "nvlink-all"), DeviceRequest("gpu", 4, None, "nvlink-all"))
    plan = plan_placement(request(devices=devices), pool(node))
    assert isinstance(plan, Plan)
    first, second = plan.chosen.atoms_by_request
    assert not set(first) & set(second)
    assert len(set(first) | set(second)) == 8
    devices = (DeviceRequest("gpu", 6), DeviceRequest("gpu", 4))
    result = plan_placement(request(devices=devices), pool(node))
    assert isinstance(result, Rejections) and result.by_node[node.id] == "fits: 2 of 8 gpu free"


def test_tied_picks_share_the_best_keys_on_a_dgx1() -> None:
    """Every tied set has the pick's worst link and NUMA spread; the pick itself comes first."""
    from app.placement.topology import tied_picks

    node = topo_node(DGX1, "dgx1")
    ct = node_topology(node.inventory).classes["gpu"]
    full = ct.full_mask
    best = pick(ct, full, 4)
    ties = tied_picks(ct, full, 4)
    assert ties[0] == best.indices
    for indices in ties:
        s = scored_set(ct, indices)
        assert (s.worst_link, s.numa_spread) == (best.worst_link, best.numa_spread)
    assert tied_picks(ct, full, 8) == (tuple(range(8)),)
    assert len(tied_picks(ct, full, 1)) == 8  # any one GPU is as good as another
    pairs = tied_picks(ct, full, 2)
    assert len(pairs) > 1 and all(scored_set(ct, p).worst_link == NV for p in pairs)
