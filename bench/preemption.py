"""Benchmark: the pure victim choice of spot preemption (app/placement/preemption.py) on pools of 10,
100 and 1,000 nodes x 8 GPUs, every GPU booked by spot work of 1, 2 or 4 GPUs (a third of the nodes
each), for a regular 8-GPU NVLink request. Prints the median of ``--repeat`` runs of the preempting plan,
of a plain plan of the same pool (which answers "nothing fits"), and their ratio: what a pending regular
request pays for asking whether preemption would help.

    python bench/preemption.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.placement.model import (  # noqa: E402
    Atom,
    DeviceRequest,
    NodeInventory,
    NodeSnapshot,
    NodeState,
    PlacementRequest,
    PoolSnapshot,
)
from app.placement.options import SchedulerOptions  # noqa: E402
from app.placement.pipeline import plan_placement  # noqa: E402
from app.placement.preemption import SpotWork, plan_preemption  # noqa: E402

START = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
END = START + timedelta(days=1)
SIZES = (10, 100, 1_000)
SHAPES = (1, 2, 4)


def pool(size: int) -> tuple[PoolSnapshot, list[SpotWork]]:
    nodes, spot = [], []
    for i in range(size):
        node_id = f"node_{i:05d}"
        atoms = tuple(Atom(f"{node_id}-GPU{g}", "gpu", numa_node=g // 4) for g in range(8))
        links = {(a.id, b.id): "NV12" for x, a in enumerate(atoms) for b in atoms[x + 1 :]}
        inventory = NodeInventory(id=node_id, name=node_id, atoms=atoms, links=links)
        nodes.append(NodeSnapshot(inventory, NodeState(booked=frozenset(a.id for a in atoms))))
        shape = SHAPES[i % len(SHAPES)]
        for k in range(0, 8, shape):
            spot.append(
                SpotWork(
                    f"res_{i:05d}_{k}",
                    "spotco",
                    START - timedelta(minutes=k),
                    START,
                    END,
                    {node_id: frozenset(a.id for a in atoms[k : k + shape])},
                )
            )
    return PoolSnapshot(id="pool", nodes=tuple(nodes)), spot


def median_seconds(run, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    request = PlacementRequest(
        tenant_id="acme",
        pool_id="pool",
        devices=(DeviceRequest("gpu", 8, None, "nvlink-all"),),
        start=START,
        end=END,
    )
    options = SchedulerOptions()
    print(f"{'nodes':>6} {'plain plan ms':>14} {'preempting plan ms':>19} {'ratio':>7} {'victims':>8}")
    for size in SIZES:
        snapshot, spot = pool(size)
        plain = median_seconds(lambda s=snapshot: plan_placement(request, s, options), args.repeat)
        found = plan_preemption(request, snapshot, spot, (), options, START)
        assert found is not None
        preempting = median_seconds(
            lambda s=snapshot, w=spot: plan_preemption(request, s, w, (), options, START), args.repeat
        )
        print(
            f"{size:>6} {plain * 1e3:>14.2f} {preempting * 1e3:>19.2f} {preempting / plain:>7.1f} "
            f"{len(found.victims):>8}"
        )


if __name__ == "__main__":
    main()
