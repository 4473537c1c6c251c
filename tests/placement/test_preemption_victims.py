"""The pure victim choice of spot preemption (app/placement/preemption.py, docs/preemption.md): tables,
no database."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from decimal import Decimal

import pytest

from app.placement.model import Gang
from app.placement.options import SchedulerOptions
from app.placement.preemption import ScalarHold, SpotWork, peak_held, plan_preemption
from tests.placement.builders import START, gpu_node, pool, request

END = START + timedelta(days=1)
HOUR = timedelta(hours=1)


def spot(rid: str, node: str, gpus: tuple[int, ...], hours: int = 24, created: int = 0) -> SpotWork:
    """A spot reservation ``rid`` booking GPU indices ``gpus`` of ``node`` from START for ``hours``."""
    return SpotWork(
        reservation_id=rid,
        tenant_id="spotco",
        created_at=START - timedelta(minutes=60 - created),
        start=START,
        end=START + hours * HOUR,
        atoms={node: frozenset(f"{node}-GPU{i}" for i in gpus)},
    )


def busy(works: list[SpotWork], node: str) -> tuple[int, ...]:
    return tuple(int(a.rsplit("GPU", 1)[1]) for w in works for a in w.atoms.get(node, ()))


def node_full_of(node: str, works: list[SpotWork], gpus: int = 8, extra: tuple[int, ...] = ()):
    return gpu_node(node, gpus, booked=busy(works, node) + extra)


# (case, node layouts {node: [(rid, gpu indices, hours, created)]}, regular booked {node: indices},
#  request count, expected node, expected victims)
CASES = [
    (
        "fewest victims wins over a node of single-GPU spot work",
        {
            "a": [(f"a{i}", (i,), 24, 0) for i in range(8)],
            "b": [("b0", (0, 1, 2, 3), 24, 0), ("b1", (4, 5, 6, 7), 24, 0)],
        },
        {},
        8,
        "b",
        ("b0", "b1"),
    ),
    (
        "least GPU-time lost: the victim ending sooner",
        {"a": [("a0", (0, 1, 2, 3), 24, 0), ("a1", (4, 5, 6, 7), 2, 0)]},
        {},
        4,
        "a",
        ("a1",),
    ),
    (
        "newest victim first when the GPU-time lost ties",
        {"a": [("old", (0, 1, 2, 3), 24, 0), ("new", (4, 5, 6, 7), 24, 30)]},
        {},
        4,
        "a",
        ("new",),
    ),
    (
        "free atoms are used before victims: one victim of two GPUs for a 4-GPU request",
        {"a": [("a0", (2, 3), 24, 0), ("a1", (4, 5), 24, 0), ("a2", (6, 7), 24, 0)]},
        {},
        4,
        "a",
        ("a2",),  # all cost the same; a2 is the newest by id order at equal creation? ids break ties
    ),
    (
        "regular work is never a victim",
        {"a": [("a0", (0, 1, 2, 3), 24, 0)]},
        {"a": (4, 5, 6, 7)},
        8,
        None,
        (),
    ),
]


@pytest.mark.parametrize(
    ("case", "layout", "regular", "count", "node", "victims"), CASES, ids=[c[0] for c in CASES]
)
def test_victim_choice(
    case: str,
    layout: dict[str, list[tuple[str, tuple[int, ...], int, int]]],
    regular: dict[str, tuple[int, ...]],
    count: int,
    node: str | None,
    victims: tuple[str, ...],
) -> None:
    works = {n: [spot(rid, n, g, h, c) for rid, g, h, c in items] for n, items in layout.items()}
    nodes = [node_full_of(n, ws, extra=regular.get(n, ())) for n, ws in works.items()]
    all_work = [w for ws in works.values() for w in ws]
    plan = plan_preemption(request(count), pool(*nodes), all_work, (), SchedulerOptions(), START)
    if node is None:
        assert plan is None
        return
    assert plan is not None
    assert [p.node_id for p in plan.placements] == [node]
    if case.startswith("free atoms"):
        assert len(plan.victims) == 1  # any one of the three equal victims, never two
        assert set(plan.placements[0].atoms) >= {"a-GPU0", "a-GPU1"}
        return
    assert tuple(v.reservation_id for v in plan.victims) == victims


def test_spot_never_preempts() -> None:
    works = [spot("a0", "a", (0, 1, 2, 3))]
    plan = plan_preemption(
        replace(request(8), spot=True), pool(node_full_of("a", works)), works, (), SchedulerOptions(), START
    )
    assert plan is None


def test_nvlink_all_takes_the_victims_that_make_a_complete_set() -> None:
    # GPUs 0-3 are NVLinked together, 4-7 together, nothing across: a 4-GPU nvlink-all request must
    # evict the one reservation that frees a whole island, not two halves of both islands
    node = gpu_node("a", 8, link=None)
    links = {}
    for island in ((0, 1, 2, 3), (4, 5, 6, 7)):
        for i in island:
            for j in island:
                if i < j:
                    links[(f"a-GPU{i}", f"a-GPU{j}")] = "NV12"
    works = [spot("x", "a", (0, 1)), spot("y", "a", (2, 3, 4, 5)), spot("z", "a", (6, 7))]
    node = replace(
        node,
        inventory=replace(node.inventory, links=links),
        state=replace(node.state, booked=frozenset(f"a-GPU{i}" for i in range(8))),
    )
    plan = plan_preemption(
        request(4, topology="nvlink-all"), pool(node), works, (), SchedulerOptions(), START
    )
    assert plan is not None
    victims = {v.reservation_id for v in plan.victims}
    assert len(victims) == 2 and "y" in victims  # y plus one of x / z completes an island
    assert set(plan.placements[0].atoms) in (
        {f"a-GPU{i}" for i in (0, 1, 2, 3)},
        {f"a-GPU{i}" for i in (4, 5, 6, 7)},
    )


def test_scalar_room_comes_from_the_victims_holdings() -> None:
    # cpu 16 on the node: regular work holds 8, spot holds 8 (4 + 4); a cpu 6 request evicts both spot
    # holders only if one is not enough: 8 free after one eviction? 16 - 8 - 4 = 4 < 6 -> two victims
    node = gpu_node("a", 2, resources={"cpu": ("16", "1", "16")})
    works = [
        SpotWork("s1", "spotco", START, START, END, {"a": frozenset()}),
        SpotWork("s2", "spotco", START + HOUR, START, END, {"a": frozenset()}),
    ]
    holds = [
        ScalarHold("a", "cpu", Decimal(8), START, END, None),
        ScalarHold("a", "cpu", Decimal(4), START, END, "s1"),
        ScalarHold("a", "cpu", Decimal(4), START, END, "s2"),
    ]
    four = plan_preemption(
        request(0, resources={"cpu": "4"}), pool(node), works, holds, SchedulerOptions(), START
    )
    assert four is not None and [v.reservation_id for v in four.victims] == ["s2"]  # the newest
    six = plan_preemption(
        request(0, resources={"cpu": "6"}), pool(node), works, holds, SchedulerOptions(), START
    )
    assert six is not None and [v.reservation_id for v in six.victims] == ["s1", "s2"]
    nine = plan_preemption(
        request(0, resources={"cpu": "9"}), pool(node), works, holds, SchedulerOptions(), START
    )
    assert nine is None  # regular work's 8 stays


def test_a_gang_evicts_on_every_member_node() -> None:
    works = [spot("a0", "a", (0, 1, 2, 3)), spot("b0", "b", (0, 1, 2, 3))]
    nodes = [node_full_of("a", works[:1], gpus=4), node_full_of("b", works[1:], gpus=4)]
    gang = replace(request(4), gang=Gang(2))
    plan = plan_preemption(gang, pool(*nodes), works, (), SchedulerOptions(), START)
    assert plan is not None
    assert sorted(p.node_id for p in plan.placements) == ["a", "b"]
    assert [v.reservation_id for v in plan.victims] == ["a0", "b0"]
    # one member node without spot work to take: no plan at all (never half a gang)
    regular = [node_full_of("a", works[:1], gpus=4), gpu_node("b", 4, booked=(0, 1, 2, 3))]
    assert plan_preemption(gang, pool(*regular), works[:1], (), SchedulerOptions(), START) is None


@pytest.mark.parametrize(
    ("holds", "peak"),
    [
        ([], 0),
        ([(0, 24, 4)], 4),
        ([(0, 12, 4), (12, 24, 4)], 4),  # half-open: end and start at one instant never add up
        ([(0, 12, 4), (6, 24, 4)], 8),
        ([(-5, 1, 3), (30, 40, 9)], 3),  # outside the window counts only where it overlaps
    ],
)
def test_peak_held(holds: list[tuple[int, int, int]], peak: int) -> None:
    rows = [ScalarHold("a", "cpu", Decimal(n), START + s * HOUR, START + e * HOUR) for s, e, n in holds]
    assert peak_held(rows, START, END) == peak
