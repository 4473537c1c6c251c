"""Every filter's reason string, in docs/architecture.md's order (first failure wins), through
plan_placement on
one node; plus ineligibility, scalar room (the Decimal floor cases) and the registry order."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from app.placement.filters.scalars import format_amount, scalar_room
from app.placement.model import (
    DeviceRequest,
    NodeSnapshot,
    PlacementRequest,
    Plan,
    Rejections,
    ScalarResource,
)
from app.placement.options import SchedulerOptions
from app.placement.pipeline import plan_placement
from app.placement.plugins import define_scheduler_plugin
from app.placement.schedulable import ineligibility, lease_ineligibility, may_be_schedulable
from app.placement.selectors import parse_selector
from tests.factories import gpu_snapshot
from tests.placement.builders import pool, request


def reason_for(
    node: NodeSnapshot, req: PlacementRequest, options: SchedulerOptions | None = None
) -> str | None:
    result = plan_placement(req, pool(node), options or SchedulerOptions())
    if isinstance(result, Plan):
        return None
    assert isinstance(result, Rejections)
    return result.by_node[node.id]


SYS = {"bc.dev/cap.devices.limits": "system"}
H100 = {"gpuProduct": "H100-SXM5-80GB", "vramGiB": 80}
REASONS: list[tuple[str, dict[str, Any], dict[str, Any], str | None]] = [
    # schedulable: the NoSchedule reasons themselves
    ("cordoned", {"reasons": ("cordoned",)}, {}, "cordoned"),
    ("not ready", {"reasons": ("not ready",)}, {}, "not ready"),
    ("heartbeat lost", {"reasons": ("heartbeat lost",)}, {}, "heartbeat lost"),
    ("taint", {"reasons": ("tainted gpu=maintenance",)}, {}, "tainted gpu=maintenance"),
    ("several", {"reasons": ("cordoned", "heartbeat lost")}, {}, "cordoned, heartbeat lost"),
    ("own dedication tolerated", {"reasons": ("tainted dedicated=acme",)}, {}, None),
    ("foreign dedication", {"reasons": ("tainted dedicated=beta",)}, {}, "tainted dedicated=beta"),
    (
        "own dedication with other reasons",
        {"reasons": ("tainted dedicated=acme", "cordoned")},
        {},
        "cordoned",
    ),
    # labels
    ("label missing", {}, {"node_labels": {"rack": "*"}}, "labels: missing rack"),
    ("label any value", {"labels": {"rack": "r1"}}, {"node_labels": {"rack": "*"}}, None),
    (
        "label wrong value",
        {"labels": {"rack": "r1"}},
        {"node_labels": {"rack": "r2"}},
        "labels: rack is r1, want r2",
    ),
    ("label value", {"labels": {"rack": "r2"}}, {"node_labels": {"rack": "r2"}}, None),
    (
        "bc.dev label from system",
        {"labels": {"bc.dev/cap.devices.limits": "1"}, "label_sources": SYS},
        {"node_labels": {"bc.dev/cap.devices.limits": "*"}},
        None,
    ),
    (
        "bc.dev label from an operator does not count",
        {
            "labels": {"bc.dev/cap.devices.limits": "1"},
            "label_sources": {"bc.dev/cap.devices.limits": "operator"},
        },
        {"node_labels": {"bc.dev/cap.devices.limits": "*"}},
        "labels: missing bc.dev/cap.devices.limits",
    ),
    (
        "bc.dev label without a source does not count",
        {"labels": {"bc.dev/driver.kvm": "1"}},
        {"node_labels": {"bc.dev/driver.kvm": "1"}},
        "labels: missing bc.dev/driver.kvm",
    ),
    (
        "first failing label in request order",
        {"labels": {"a": "1"}},
        {"node_labels": {"a": "2", "b": "*"}},
        "labels: a is 1, want 2",
    ),
    # scalars
    (
        "scalar short",
        {"resources": {"cpu": ("8", "1", "6")}},
        {"resources": {"cpu": "4"}},
        "scalars: cpu needs 4, 2 free",
    ),
    ("scalar missing row", {}, {"resources": {"memory": "1"}}, "scalars: memory needs 1, 0 free"),
    ("scalar fits", {"resources": {"cpu": ("8", "1", "4")}}, {"resources": {"cpu": "4"}}, None),
    (
        "scalar fraction",
        {"resources": {"cpu": ("8", "1", "7.75")}},
        {"resources": {"cpu": "0.5"}},
        "scalars: cpu needs 0.5, 0.25 free",
    ),
    (
        "100 x 0.29 is 29: the last unit places",
        {"resources": {"u": ("100", "0.29", "28")}},
        {"resources": {"u": "1"}},
        None,
    ),
    (
        "100 x 0.29 is 29, not 30",
        {"resources": {"u": ("100", "0.29", "28")}},
        {"resources": {"u": "2"}},
        "scalars: u needs 2, 1 free",
    ),
    (
        "over-allocated: negative room is 0",
        {"resources": {"cpu": ("8", "0.5", "6")}},
        {"resources": {"cpu": "1"}},
        "scalars: cpu needs 1, 0 free",
    ),
    # selector
    (
        "selector short",
        {"attributes": H100},
        {"count": 2, "selector": parse_selector("vramGiB > 80")},
        "selector: 0 of 4 gpu match",
    ),
    (
        "selector on a class the node lacks",
        {},
        {"device_class": "fpga", "selector": parse_selector("x")},
        "selector: 0 of 0 fpga match",
    ),
    ("selector ok", {"attributes": H100}, {"count": 4, "selector": parse_selector("vramGiB >= 80")}, None),
    # fits
    ("fits: booked", {"booked": (0, 1, 2)}, {"count": 2}, "fits: 1 of 4 gpu free"),
    ("fits: unhealthy", {"unavailable": (0, 1)}, {"count": 3}, "fits: 2 of 4 gpu free"),
    ("fits: class absent", {}, {"device_class": "fpga"}, "fits: 0 of 0 fpga free"),
    ("fits: more than the node has", {}, {"count": 5}, "fits: 4 of 4 gpu free"),
    (
        "fits counts matching atoms only",
        {"attributes": H100, "booked": (0,)},
        {"count": 4, "selector": parse_selector("gpuProduct = H100-SXM5-80GB")},
        "fits: 3 of 4 gpu free",
    ),
    # topology
    (
        "nvlink-all over PCIe",
        {"link": "PIX"},
        {"count": 2, "topology": "nvlink-all"},
        "topology: no NVLink-complete set of 2 gpu",
    ),
    (
        "nvlink-all unknown links",
        {"link": None},
        {"count": 2, "topology": "nvlink-all"},
        "topology: no NVLink-complete set of 2 gpu",
    ),
    ("nvlink-all one GPU", {"link": None}, {"count": 1, "topology": "nvlink-all"}, None),
    ("nvlink-all over NV", {"link": "NV18"}, {"count": 4, "topology": "nvlink-all"}, None),
]


@pytest.mark.parametrize(
    ("case", "node_args", "request_args", "reason"), REASONS, ids=[r[0] for r in REASONS]
)
def test_reason(
    case: str, node_args: dict[str, Any], request_args: dict[str, Any], reason: str | None
) -> None:
    assert reason_for(gpu_snapshot(**node_args), request(**request_args)) == reason


def test_first_failure_wins() -> None:
    node = gpu_snapshot(
        reasons=("cordoned",), booked=(0, 1, 2, 3), link="PIX", resources={"cpu": ("1", "1", "1")}
    )
    req = request(count=2, topology="nvlink-all", resources={"cpu": "1"}, node_labels={"rack": "*"})
    assert reason_for(node, req) == "cordoned"
    node = gpu_snapshot(booked=(0, 1, 2, 3), link="PIX", resources={"cpu": ("1", "1", "1")})
    assert reason_for(node, req) == "labels: missing rack"
    node = gpu_snapshot(
        booked=(0, 1, 2, 3), link="PIX", labels={"rack": "r1"}, resources={"cpu": ("1", "1", "1")}
    )
    assert reason_for(node, req) == "scalars: cpu needs 1, 0 free"
    node = gpu_snapshot(
        booked=(0, 1, 2, 3), link="PIX", labels={"rack": "r1"}, resources={"cpu": ("2", "1", "1")}
    )
    assert reason_for(node, req) == "fits: 0 of 4 gpu free"


QUARANTINE = define_scheduler_plugin(
    "rack-affinity",
    filters=[
        {
            "id": "no-quarantine-rack",
            "filter": lambda request, node: (
                {"reason": "rack r13 is quarantined"} if node.inventory.labels.get("rack") == "r13" else True
            ),
        }
    ],
)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (True, None),
        (None, None),
        ({"reason": "rack r13 is quarantined"}, "p/f: rack r13 is quarantined"),
        (False, "p/f: rejected"),
        ("busy", "p/f: busy"),
    ],
)
def test_plugin_filter_answers(answer: Any, reason: str | None) -> None:
    plugin = define_scheduler_plugin("p", filters=[{"id": "f", "filter": lambda request, node: answer}])
    assert reason_for(gpu_snapshot(), request(), SchedulerOptions(plugins=(plugin,))) == reason


def test_plugin_filter_runs_after_labels_and_before_scalars() -> None:
    options = SchedulerOptions(plugins=(QUARANTINE,))
    node = gpu_snapshot(labels={"rack": "r13"})
    assert reason_for(node, request(resources={"cpu": "1"}), options) == (
        "rack-affinity/no-quarantine-rack: rack r13 is quarantined"
    )
    assert reason_for(node, request(node_labels={"zone": "*"}), options) == "labels: missing zone"


def first_two(request: Any, device: DeviceRequest, node: Any, free: list[str]) -> list[str]:
    return free[: device.count]


@pytest.mark.parametrize(
    ("picker", "reason"),
    [
        (lambda r, d, n, free: free[: d.count], None),
        (lambda r, d, n, free: free[:1], "picker pick: returned 1 atoms, want 2"),
        (lambda r, d, n, free: [free[0], free[0]], "picker pick: returned an atom twice"),
        (
            lambda r, d, n, free: ["node_a-GPU0", free[0]],
            "picker pick: returned node_a-GPU0, which is not a free candidate",
        ),
        (
            lambda r, d, n, free: ["GPU-elsewhere", free[0]],
            "picker pick: returned GPU-elsewhere, which is not a free candidate",
        ),
    ],
)
def test_picker_reasons(picker: Any, reason: str | None) -> None:
    plugin = define_scheduler_plugin("pick", pickers=[{"deviceClass": "gpu", "preferAllocation": picker}])
    node = gpu_snapshot(booked=(0,))
    assert reason_for(node, request(count=2), SchedulerOptions(plugins=(plugin,))) == reason


def test_plugin_picker_wins_and_must_be_nvlink_complete_for_nvlink_all() -> None:
    last_two = define_scheduler_plugin(
        "last", pickers=[{"deviceClass": "gpu", "preferAllocation": lambda r, d, n, free: free[-d.count :]}]
    )
    plan = plan_placement(request(count=2), pool(gpu_snapshot()), SchedulerOptions(plugins=(last_two,)))
    assert isinstance(plan, Plan) and plan.chosen.atoms == ("node_a-GPU2", "node_a-GPU3")
    # GPU0-GPU1 NV, everything else PIX: the default pick finds the pair, the plugin's pick is not NV
    from tests.placement.builders import topo_node

    node = topo_node("06-3x-rtx-a6000-nv4-pair-ansi-header")
    req = request(count=2, topology="nvlink-all")
    assert reason_for(node, req) is None
    assert reason_for(node, req, SchedulerOptions(plugins=(last_two,))) == (
        "picker last: the 2 gpu are not NVLink-complete"
    )


# -- ineligibility and its twins --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reasons", "tenant", "archived", "expected"),
    [
        ((), "acme", False, None),
        ((), None, False, None),
        ((), "acme", True, "pool is archived"),
        (("cordoned",), "acme", True, "pool is archived"),
        (("tainted dedicated=acme",), "acme", False, None),
        (("tainted dedicated=acme",), None, False, "tainted dedicated=acme"),
        (("tainted dedicated=acme",), "beta", False, "tainted dedicated=acme"),
        (("tainted dedicated=acme", "tainted dedicated=beta"), "acme", False, "tainted dedicated=beta"),
        (
            ("not ready", "tainted dedicated=acme", "heartbeat lost"),
            "acme",
            False,
            "not ready, heartbeat lost",
        ),
        (("tainted dedicated=acmex",), "acme", False, "tainted dedicated=acmex"),
    ],
)
def test_ineligibility(
    reasons: tuple[str, ...], tenant: str | None, archived: bool, expected: str | None
) -> None:
    node = gpu_snapshot(reasons=reasons)
    assert ineligibility(node, pool(node, archived=archived), tenant) == expected


@pytest.mark.parametrize(
    ("reasons", "leasable", "tenant", "expected"),
    [
        (("cordoned", "heartbeat lost"), True, "acme", None),
        (("tainted dedicated=acme",), True, "acme", None),
        (("tainted dedicated=beta", "cordoned"), True, "acme", "tainted dedicated=beta"),
        ((), False, "acme", "not leasable"),
    ],
)
def test_lease_ineligibility(
    reasons: tuple[str, ...], leasable: bool, tenant: str, expected: str | None
) -> None:
    node = gpu_snapshot(reasons=reasons, leasable=leasable)
    assert lease_ineligibility(node, pool(node), tenant) == expected
    binding_node = request(binding="node")
    assert reason_for(node, binding_node) == expected


@pytest.mark.parametrize(
    ("reasons", "expected"),
    [
        ((), True),
        (("tainted dedicated=acme",), True),
        (("tainted dedicated=acme", "tainted dedicated=acme"), True),
        (("tainted dedicated=acme", "tainted dedicated=beta"), False),
        (("cordoned",), False),
        (("tainted dedicated=acme", "cordoned"), False),
    ],
)
def test_may_be_schedulable(reasons: tuple[str, ...], expected: bool) -> None:
    node = gpu_snapshot(reasons=reasons)
    assert may_be_schedulable(node, pool(node)) is expected
    assert may_be_schedulable(node, pool(node, archived=True)) is False


# -- scalar room -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allocatable", "ratio", "allocated", "room"),
    [
        ("100", "0.29", "0", "29"),  # float math would give 28
        ("100", "0.29", "29", "0"),
        ("10", "1.5", "0", "15"),
        ("7", "0.5", "0", "3"),  # floor(3.5)
        ("7", "0.5", "1.5", "1.5"),
        ("8", "1", "10", "0"),  # over-allocated: never negative
        ("0", "1", "0", "0"),
        ("1000000000000", "0.999999", "0", "999999000000"),
    ],
)
def test_scalar_room(allocatable: str, ratio: str, allocated: str, room: str) -> None:
    assert scalar_room(ScalarResource(Decimal(allocatable), Decimal(ratio), Decimal(allocated))) == Decimal(
        room
    )


def test_scalar_room_of_floats_is_exact() -> None:
    assert scalar_room(ScalarResource(100, 0.29, 0)) == 29  # type: ignore[arg-type]
    assert scalar_room(None) == 0


@pytest.mark.parametrize(("amount", "text"), [("4.000", "4"), ("0.50", "0.5"), ("1E+3", "1000"), ("0", "0")])
def test_format_amount(amount: str, text: str) -> None:
    assert format_amount(Decimal(amount)) == text
