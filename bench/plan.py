"""Benchmark: ``plan_placement`` over pools of 48, 1,000 and 10,000 DGX-like nodes of 8 GPUs.

Prints the median time per plan (cold: first plan of freshly built inventories; warm: the same
inventory objects again, as the I/O half's per-pool cache hands them out), with and without a selector,
and the ratios between sizes. Targets (issue 3): 48 nodes under 5 ms, 10,000 nodes under 200 ms.

Then the plan of a preview as the service makes it (issue 15): the shortlist on the cached inventory
(selector matches memoized per (selector, node signature) in the pool cache) and the pipeline on the
shortlisted nodes, p50 / p99 over ``--preview-repeat`` plans of a free pool, with and without a
selector, at 1,000 and 10,000 nodes. Targets: preview p99 with a selector at most 30 ms at 1,000 nodes
and 60 ms at 10,000 (the HTTP preview of bench/reserve.py adds the pool-head and exceptions reads).

    python bench/plan.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))

from app.placement.model import (  # noqa: E402
    Atom,
    DeviceRequest,
    NodeInventory,
    NodeSnapshot,
    NodeState,
    PlacementRequest,
    PoolSnapshot,
    ScalarResource,
)
from app.placement.options import SchedulerOptions  # noqa: E402
from app.placement.pipeline import plan_placement  # noqa: E402
from app.placement.selectors import parse_selector  # noqa: E402

# The DGX-1 hybrid cube mesh (tests/data/topo/01-dgx1-v100-hybrid-cube-mesh-mlx5.expected.json).
DGX1_NV = {(0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 5), (2, 3), (2, 6), (3, 7)}
DGX1_NV |= {(4, 5), (4, 6), (4, 7), (5, 6), (5, 7), (6, 7)}


def dgx_node(i: int) -> NodeSnapshot:
    """One DGX-1-like node: 8 GPUs on two NUMA nodes, NV/SYS links, a few booked on some nodes."""
    name = f"dgx-{i:05d}"
    atoms = tuple(
        Atom(
            id=f"{name}-GPU{g}",
            device_class="gpu",
            attributes={"gpuProduct": "V100-SXM2-32GB", "vramGiB": 32, "migCapable": False},
            numa_node=g // 4,
        )
        for g in range(8)
    )
    links = {
        (atoms[a].id, atoms[b].id): ("NV2" if (a, b) in DGX1_NV else "SYS")
        for a in range(8)
        for b in range(a + 1, 8)
    }
    booked = frozenset(atoms[g].id for g in range(i % 4))  # a quarter of nodes empty, others partly busy
    return NodeSnapshot(
        inventory=NodeInventory(
            id=f"node_{i:06d}",
            name=name,
            labels={"gpu.product": "V100-SXM2-32GB", "rack": f"r{i % 20}"},
            label_sources={"gpu.product": "system", "rack": "operator"},
            atoms=atoms,
            links=links,
        ),
        state=NodeState(
            booked=booked,
            resources={"cpu": ScalarResource(Decimal(80), Decimal(1), Decimal(8 * (i % 4)))},
        ),
    )


def pool(n: int) -> PoolSnapshot:
    return PoolSnapshot(id="pool_bench", nodes=tuple(dgx_node(i) for i in range(n)))


def request(selector: bool) -> PlacementRequest:
    start = datetime(2026, 12, 1, tzinfo=UTC)
    sel = (
        parse_selector("gpuProduct in (V100-SXM2-32GB, A100), vramGiB >= 32, gpu.product")
        if selector
        else None
    )
    return PlacementRequest(
        tenant_id="acme",
        pool_id="pool_bench",
        devices=(DeviceRequest("gpu", 4, sel),),
        resources={"cpu": Decimal(16)},
        start=start,
        end=start + timedelta(days=1),
    )


def timed(req: PlacementRequest, snapshot: PoolSnapshot, repeat: int) -> tuple[float, float]:
    """(cold ms, warm median ms)."""
    options = SchedulerOptions(seed=7)
    t0 = time.perf_counter()
    plan_placement(req, snapshot, options)
    cold = (time.perf_counter() - t0) * 1000
    warm = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan_placement(req, snapshot, options)
        warm.append((time.perf_counter() - t0) * 1000)
    return cold, statistics.median(warm)


def preview_plan(req: PlacementRequest, snapshot: PoolSnapshot, repeat: int) -> tuple[float, float, str]:
    """(p50 ms, p99 ms, path) of the preview's plan: shortlist rows on the cached inventory, then the
    pipeline on the shortlisted nodes (falling back to the whole pool when not provably complete)."""
    from app.placement.model import PoolInventory
    from app.placement.shortlist import (
        Exceptions,
        pick_ceiling,
        provably_complete,
        shortlist_applies,
        shortlist_rows,
        shortlist_size,
    )

    options = SchedulerOptions(seed=7)
    inventory = PoolInventory(
        version=1,
        nodes={n.id: n.inventory for n in snapshot.nodes},
        order=tuple(n.id for n in snapshot.nodes),
        resource_names={n.id: frozenset(n.state.resources) for n in snapshot.nodes},
    )
    states = {n.id: n for n in snapshot.nodes}
    free = Exceptions({}, {}, {}, frozenset(), frozenset())
    needed = max(options.top_n, 10)
    k = shortlist_size(options, 48)
    took, path = [], "full"
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        path = "full"
        if shortlist_applies(req, options):
            rows = shortlist_rows(inventory, req, options, free, k + 1)
            inside = PoolSnapshot(id=snapshot.id, nodes=tuple(states[node_id] for node_id, _ in rows[:k]))
            plan = plan_placement(req, inside, options)
            if provably_complete(plan, rows, k, needed, pick_ceiling(inventory, req, options)):
                path = "shortlist"
        if path == "full":
            plan_placement(req, snapshot, options)
        took.append((time.perf_counter() - t0) * 1000)
    warm = sorted(took[1:])  # the first plan fills the memos (once per inventory version)
    return warm[len(warm) // 2], warm[min(len(warm) - 1, round(0.99 * (len(warm) - 1)))], path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--preview-repeat", type=int, default=100)
    args = parser.parse_args()
    sizes = (48, 1_000, 10_000)
    for selector in (False, True):
        label = "with selector" if selector else "no selector"
        results = {}
        for n in sizes:
            snapshot = pool(n)  # fresh inventory objects: the first plan is cold
            results[n] = timed(request(selector), snapshot, args.repeat)
            cold, warm = results[n]
            per_node = warm * 1000 / n
            print(f"{label} {n:>6} nodes: cold {cold:8.2f} ms, warm {warm:8.2f} ms ({per_node:.1f} µs/node)")
        for a, b in ((48, 1_000), (1_000, 10_000)):
            print(
                f"{label:14} ratio {b}/{a} nodes ({b / a:.1f}x size): "
                f"cold {results[b][0] / results[a][0]:.1f}x  warm {results[b][1] / results[a][1]:.1f}x"
            )
    print()
    print("Preview plan through the shortlist (free pool; targets with a selector: p99 <= 30 ms at 1,000")
    print("nodes, <= 60 ms at 10,000)")
    for n, target in ((1_000, 30.0), (10_000, 60.0)):
        snapshot = pool(n)
        for selector in (False, True):
            p50, p99, path = preview_plan(request(selector), snapshot, args.preview_repeat)
            label = "with selector" if selector else "no selector"
            verdict = ("ok" if p99 <= target else "MISSED") if selector else ""
            print(f"  {n:>6} nodes {label:14} p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  ({path}) {verdict}")


if __name__ == "__main__":
    main()
