"""Rejection rows and nearest misses (docs/reasons.md, "Rejection rows" and "Nearest misses"): pure, on
snapshots built in memory. A table of one node per filter gives each shortfall in the request's terms;
the closest-first order and the rows' counts are checked on mixed pools."""

from __future__ import annotations

import random

import pytest

from app.placement.model import NodeSnapshot, PlacementRequest, Rejections
from app.placement.options import SchedulerOptions
from app.placement.pipeline import plan_placement
from app.placement.plugins import define_scheduler_plugin
from app.placement.selectors import parse_selector
from app.placement.why_not import WhyNot, why_not
from tests.factories import gpu_snapshot
from tests.placement.builders import DGX1, pool, request, topo_node


def _why(req: PlacementRequest, *nodes: NodeSnapshot, options: SchedulerOptions | None = None) -> WhyNot:
    opts = options or SchedulerOptions()
    snapshot = pool(*nodes)
    plan = plan_placement(req, snapshot, opts)
    assert isinstance(plan, Rejections), plan
    return why_not(req, snapshot, plan, opts)


H100 = {"gpuProduct": "H100"}
A100 = {"gpuProduct": "A100"}
CPU = {"cpu": ("64", "1", "44")}  # 20 free

# (case, node, request, filter, shortfall, missing atoms)
TABLE = [
    ("fits", gpu_snapshot("n", 4, booked=(0,)), request(4), "fits", "3 of 4 gpu free", 1),
    (
        "topology",
        topo_node(DGX1, "n"),
        request(8, topology="nvlink-all"),
        "topology",
        "best NVLink set is 4 of 8",
        4,
    ),
    (
        "scalars",
        gpu_snapshot("n", 4, resources=CPU),
        request(1, resources={"cpu": "32"}),
        "scalars",
        "cpu needs 32, 20 free",
        0,
    ),
    (
        "selector",
        gpu_snapshot("n", 8, attributes=A100),
        request(2, selector=parse_selector("gpuProduct in (H100)")),
        "selector",
        "selector: 0 of 8 gpu match (gpuProduct In [H100])",
        2,
    ),
    (
        "dedicated",
        gpu_snapshot("n", 4, reasons=("tainted dedicated=beta",)),
        request(1),
        "schedulable",
        "tainted dedicated=beta",
        0,
    ),
    ("cordoned", gpu_snapshot("n", 4, reasons=("cordoned",)), request(1), "schedulable", "cordoned", 0),
    (
        "labels",
        gpu_snapshot("n", 4),
        request(1, node_labels={"rack": "r1"}),
        "labels",
        "labels: missing rack",
        0,
    ),
    ("no such class", gpu_snapshot("n", 4), request(1, device_class="tpu"), "fits", "0 of 1 tpu free", 1),
]


@pytest.mark.parametrize(
    ("case", "node", "req", "flt", "shortfall", "missing"), TABLE, ids=[t[0] for t in TABLE]
)
def test_each_filter_gives_its_shortfall_in_the_request_terms(
    case: str, node: NodeSnapshot, req: PlacementRequest, flt: str, shortfall: str, missing: int
) -> None:
    found = _why(req, node)
    [miss] = found.nearest
    assert (miss.node_name, miss.filter, miss.shortfall, miss.missing_atoms) == ("n", flt, shortfall, missing)
    [row] = found.rows
    assert (row.filter, row.count, row.nodes) == (flt, 1, ("n",))
    assert row.reason == miss.reason


def test_closest_is_fewest_missing_atoms_then_scalars_then_the_later_filter() -> None:
    nodes = [
        gpu_snapshot("far", 8, booked=(0, 1, 2, 3, 4, 5)),  # 6 missing... of 8: 2 free
        gpu_snapshot("cordoned-full", 8, reasons=("cordoned",)),  # 0 missing, rejected first
        gpu_snapshot("one-short", 8, booked=(0,)),  # 1 missing
        gpu_snapshot("cpu-short", 8, resources={"cpu": ("64", "1", "60")}),  # 0 missing, cpu short
        gpu_snapshot("cpu-shorter", 8, resources={"cpu": ("64", "1", "63")}),  # 0 missing, cpu shorter
    ]
    req = request(8, resources={"cpu": "8"})
    found = _why(req, *nodes)
    # cordoned-full misses no atom and, having no cpu row, all 8 cpu (a full share); cpu-short misses 4
    # of 8 (half), cpu-shorter 7 of 8; one-short misses an atom
    assert [m.node_name for m in found.nearest] == ["cpu-short", "cpu-shorter", "cordoned-full"]
    assert [m.missing_atoms for m in found.nearest] == [0, 0, 0]
    assert found.nearest[0].shortfall == "cpu needs 8, 4 free"


def test_the_later_filter_breaks_a_tie() -> None:
    nodes = [
        gpu_snapshot("a-cordoned", 4, reasons=("cordoned",)),
        gpu_snapshot("b-labels", 4),
    ]
    found = _why(request(1, node_labels={"rack": "r1"}), *nodes)
    assert [m.node_name for m in found.nearest] == ["b-labels", "a-cordoned"]


def test_rows_add_up_to_the_pool_and_name_at_most_five_nodes() -> None:
    rng = random.Random(25)
    nodes = []
    for i in range(100):
        roll = rng.random()
        if roll < 0.2:
            nodes.append(gpu_snapshot(f"n{i:03d}", 8, reasons=("cordoned",)))
        elif roll < 0.3:
            nodes.append(gpu_snapshot(f"n{i:03d}", 8, reasons=("tainted dedicated=beta",)))
        elif roll < 0.5:
            nodes.append(gpu_snapshot(f"n{i:03d}", 8, resources={"cpu": ("16", "1", "0")}))
        else:
            nodes.append(gpu_snapshot(f"n{i:03d}", 8, booked=tuple(range(rng.randint(1, 8)))))
    req = request(8, resources={"cpu": "32"})
    snapshot = pool(*nodes)
    plan = plan_placement(req, snapshot, SchedulerOptions())
    assert isinstance(plan, Rejections)
    found = why_not(req, snapshot, plan, SchedulerOptions())
    assert sum(r.count for r in found.rows) == 100
    assert all(len(r.nodes) == min(r.count, 5) for r in found.rows)
    assert [(-r.count, r.reason) for r in found.rows] == sorted((-r.count, r.reason) for r in found.rows)
    for row in found.rows:  # every named node really has that reason, from that filter
        for name in row.nodes:
            assert plan.by_node[name] == row.reason and plan.filters[name] == row.filter
    # the nodes without cpu rows fail on scalars first; the cordoned ones on schedulable
    assert {r.filter for r in found.rows} == {"schedulable", "scalars"}


def test_a_lost_race_exclusion_and_an_admit_refusal_have_rows() -> None:
    nodes = [gpu_snapshot("a", 4, booked=(0, 1, 2, 3)), gpu_snapshot("b", 4)]
    options = SchedulerOptions(excluded_nodes=frozenset({"b"}))
    found = _why(request(1), *nodes, options=options)
    assert {(r.filter, r.count) for r in found.rows} == {("excluded", 1), ("fits", 1)}
    refuse = define_scheduler_plugin("no", admit=lambda req: "closed for maintenance")
    found = _why(request(1), *nodes, options=SchedulerOptions(plugins=(refuse,)))
    assert [(r.filter, r.count, r.nodes) for r in found.rows] == [("admit", 2, ("a", "b"))]
    assert found.nearest == ()
