"""The intake check's pure half (app/placement/intake.py; docs/api.md, "Checked at intake"): tables of
pools and requests, no database."""

from __future__ import annotations

from decimal import Decimal
from itertools import combinations
from typing import Any

import pytest

from app.placement.intake import IntakeVerdict, judge, pool_shapes
from app.placement.model import (
    Atom,
    DeviceRequest,
    Gang,
    MatchExpression,
    NodeInventory,
    PlacementRequest,
    Selector,
)

H100 = {"gpuProduct": "H100", "vramGiB": 80}
A10 = {"gpuProduct": "A10", "vramGiB": 24}


def node(
    name: str,
    gpus: int = 8,
    attributes: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    nv_groups: int = 1,
    device_class: str = "gpu",
) -> NodeInventory:
    """``gpus`` atoms sharing one attributes mapping, NVLinked within ``nv_groups`` equal groups (SYS
    between groups)."""
    shared = dict(attributes if attributes is not None else H100)
    atoms = tuple(Atom(f"{name}-GPU{i}", device_class, shared, 0) for i in range(gpus))
    size = max(1, gpus // nv_groups)
    links = {
        (a.id, b.id): "NV12" if i // size == j // size else "SYS"
        for (i, a), (j, b) in combinations(enumerate(atoms), 2)
    }
    return NodeInventory(name, name, dict(labels or {}), {}, atoms, links)


def request(
    devices: tuple[DeviceRequest, ...] = (), resources: dict[str, int] | None = None, gang: Gang | None = None
) -> PlacementRequest:
    amounts = {k: Decimal(v) for k, v in (resources or {}).items()}
    return PlacementRequest("acme", "gpu-hosts", devices, amounts, gang=gang)


def gpus(count: int, *expressions: MatchExpression, topology: str | None = None) -> DeviceRequest:
    return DeviceRequest("gpu", count, Selector(expressions) if expressions else None, topology)


CPU = {"cpu": Decimal(64)}

POOL = [node("a", 8), node("b", 4, A10, nv_groups=2), node("c", 8, labels={"rack": "r1"})]
CAPS = {"a": {"cpu": Decimal(128)}, "b": CPU, "c": CPU}


def verdict(req: PlacementRequest, nodes: list[NodeInventory] = POOL, caps: Any = None) -> IntakeVerdict:
    return judge("gpu-hosts", pool_shapes(nodes, CAPS if caps is None else caps), req)


@pytest.mark.parametrize(
    ("req", "invalid"),
    [
        (
            request((DeviceRequest("tpu", 1),)),
            ("devices.0.class", "pool gpu-hosts has no device class tpu; it has: gpu"),
        ),
        (
            request((gpus(1), DeviceRequest("mig-1g", 1))),
            ("devices.1.class", "pool gpu-hosts has no device class mig-1g; it has: gpu"),
        ),
        (
            request((gpus(1),), {"cpus": 4}),
            ("resources.cpus", "pool gpu-hosts has no resource cpus; it has: cpu"),
        ),
    ],
)
def test_an_unknown_class_or_resource_is_invalid_at_its_field(
    req: PlacementRequest, invalid: tuple[str, str]
) -> None:
    assert verdict(req).invalid == invalid


@pytest.mark.parametrize(
    ("req", "reason"),
    [
        (request((gpus(100),)), "no node of pool gpu-hosts can hold 100 gpu: the largest has 8"),
        (
            request((gpus(1),), {"cpu": 200}),
            "no node of pool gpu-hosts can hold 200 cpu: the largest has 128",
        ),
        # the selector: only the A10 node matches, and it has 4
        (
            request((gpus(5, MatchExpression("gpuProduct", "In", ("A10",))),)),
            "no node of pool gpu-hosts can hold 5 gpu matching the selector: the largest has 4",
        ),
        (
            request((gpus(1, MatchExpression("vramGiB", "Gt", (Decimal(80),))),)),
            "no node of pool gpu-hosts can hold 1 gpu matching the selector: the largest has 0",
        ),
        # two device requests of one class never share atoms
        (
            request((gpus(5), gpus(4))),
            "no node of pool gpu-hosts can hold 5 gpu and 4 gpu together",
        ),
        # each part fits some node, no node holds both
        (
            request((gpus(8),), {"cpu": 100}),
            None,  # node a: 8 gpu and 128 cpu
        ),
        (
            request((gpus(5, MatchExpression("gpuProduct", "In", ("H100",))),), {"cpu": 100}),
            None,
        ),
        (
            request((gpus(8),), {"cpu": 100}, Gang(2)),
            "no 2 nodes of pool gpu-hosts can hold a member each: the largest set has 1",
        ),
        (request((gpus(8),), gang=Gang(2)), None),
        (
            request((gpus(8),), gang=Gang(2, "rack")),
            "no rack of pool gpu-hosts has 2 nodes that can hold a member each: the largest has 1",
        ),
        (request((gpus(4),), gang=Gang(3)), None),
    ],
)
def test_a_request_no_node_could_hold_names_the_largest_shape(
    req: PlacementRequest, reason: str | None
) -> None:
    found = verdict(req)
    assert found.invalid is None and found.unsatisfiable == reason


def test_the_nvlink_check_uses_the_largest_nvlink_complete_set() -> None:
    split = [node("x", 8, nv_groups=2)]  # two NVLink islands of 4
    nvlink = "nvlink-all"
    assert verdict(request((gpus(4, topology=nvlink),)), split).unsatisfiable is None
    assert verdict(request((gpus(5, topology=nvlink),)), split).unsatisfiable == (
        "no node of pool gpu-hosts can hold 5 gpu NVLink-complete: the largest has 4"
    )
    assert verdict(request((gpus(8),)), split).unsatisfiable is None  # without nvlink-all: 8 atoms


def test_labels_never_make_a_request_unsatisfiable() -> None:
    # a selector key the atoms lack reads a node label, which may come later: not held against them
    on_label = MatchExpression("fabric.domain", "In", ("f1",))
    found = verdict(request((gpus(8, on_label),)))
    assert found.unsatisfiable is None
    assert found.warnings == (
        "selector key fabric.domain (devices.0) is carried by no device attribute or node label of pool "
        "gpu-hosts",
    )
    # a key some node carries as a label is no warning
    assert verdict(request((gpus(1, MatchExpression("rack", "Exists")),))).warnings == ()
    assert verdict(request((gpus(1, MatchExpression("gpuProduct", "Exists")),))).warnings == ()


def test_an_empty_pool_is_not_judged() -> None:
    assert verdict(request((DeviceRequest("tpu", 100),), {"cpus": 4}), [], {}) == IntakeVerdict()


def test_nodes_of_one_shape_are_judged_once() -> None:
    many = [node(f"n{i}", 8) for i in range(500)]
    shapes = pool_shapes(many, {n.id: CPU for n in many})
    assert len(shapes.shapes) == 1
    assert judge("p", shapes, request((gpus(8),), gang=Gang(500))).unsatisfiable is None
    assert judge("p", shapes, request((gpus(8),), gang=Gang(501))).unsatisfiable == (
        "no 501 nodes of pool p can hold a member each: the largest set has 500"
    )
