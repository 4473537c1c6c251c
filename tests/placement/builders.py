"""Builders of pipeline inputs for the pure placement tests (no database).

The plain node snapshot (``gpu_snapshot``) lives in :mod:`tests.factories`, the one home of node
factories; ``gpu_node`` here is that function under its older name. ``topo_node`` builds a node from a
real ``nvidia-smi topo -m`` fixture's expected parse
(``tests/data/topo/*.expected.json``: ``gpu_links`` and ``numa_affinity``), so pick rules are tested on
the real DGX-1 hybrid cube mesh, DGX A100 / H100 and PCIe matrices.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from app.placement.model import (
    Atom,
    DeviceRequest,
    NodeInventory,
    NodeSnapshot,
    NodeState,
    PlacementRequest,
    PoolSnapshot,
    Selector,
)
from tests.factories import gpu_snapshot

gpu_node = gpu_snapshot  # the older name, kept for tests written before the factories were one
TOPO = Path(__file__).resolve().parent.parent / "data" / "topo"
START = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

DGX1 = "01-dgx1-v100-hybrid-cube-mesh-mlx5"
DGX_A100 = "02-dgx-a100-12nic-mlx5-names"
DGX_H100 = "03-dgx-h100-nv18-8nic-legend-space-aligned"
A100_4X = "05-4x-a100-nv4-mangled-header"
A6000_3X = "06-3x-rtx-a6000-nv4-pair-ansi-header"
K80 = "07-k80-4gpu-pcie-legacy-soc-legend"
RTX4090_8X = "08-8x-rtx4090-all-sys-2nic-no-legend"
NV4_4GPU = "16-4gpu-nv4-empty-cpu-affinity-cells"


def topo_fixture(name: str) -> dict[str, Any]:
    return json.loads((TOPO / f"{name}.expected.json").read_text())


def topo_node(
    name: str,
    node_id: str = "node_a",
    numa: dict[str, int | None] | None = None,
    booked: tuple[int, ...] = (),
    unavailable: tuple[int, ...] = (),
) -> NodeSnapshot:
    """A node whose GPUs ``<node_id>-GPU<i>`` are linked as the fixture's ``gpu_links`` say, with NUMA
    nodes from its ``numa_affinity`` (first value) unless ``numa`` overrides them."""
    fixture = topo_fixture(name)
    gpus: list[str] = fixture["gpus"]
    affinity = fixture.get("numa_affinity") or {}
    atoms = []
    for gpu in gpus:
        if numa is not None:
            numa_node = numa.get(gpu)
        else:
            values = affinity.get(gpu)
            numa_node = values[0] if values else None
        atoms.append(Atom(id=f"{node_id}-{gpu}", device_class="gpu", numa_node=numa_node))
    links = {}
    for pair, link in fixture["gpu_links"].items():
        a, b = pair.split("-")
        x, y = sorted((f"{node_id}-{a}", f"{node_id}-{b}"))
        links[(x, y)] = link
    state = NodeState(
        booked=frozenset(f"{node_id}-GPU{i}" for i in booked),
        unavailable=frozenset(f"{node_id}-GPU{i}" for i in unavailable),
    )
    return NodeSnapshot(NodeInventory(id=node_id, name=node_id, atoms=tuple(atoms), links=links), state)


def request(
    count: int = 1,
    device_class: str = "gpu",
    selector: Selector | None = None,
    topology: str | None = None,
    resources: dict[str, str] | None = None,
    node_labels: dict[str, str] | None = None,
    tenant_id: str = "acme",
    devices: tuple[DeviceRequest, ...] | None = None,
    binding: str = "device",
) -> PlacementRequest:
    """A request for ``count`` GPUs (or ``devices``) for one day from ``START``."""
    if devices is None:
        devices = (DeviceRequest(device_class, count, selector, topology),) if count else ()
    return PlacementRequest(
        tenant_id=tenant_id,
        pool_id="pool_a",
        devices=devices,
        resources={k: Decimal(v) for k, v in (resources or {}).items()},
        start=START,
        end=START + timedelta(days=1),
        node_labels=dict(node_labels or {}),
        binding=binding,  # type: ignore[arg-type]
    )


def pool(*nodes: NodeSnapshot, archived: bool = False) -> PoolSnapshot:
    return PoolSnapshot(id="pool_a", archived=archived, nodes=tuple(nodes))
