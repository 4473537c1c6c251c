"""The one home of the ``bc.dev/`` rule and requiredCapabilities (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.errors import InvalidInput
from app.placement.request import ReservationRequest, to_placement_request
from app.placement.system_labels import (
    hello_system_labels,
    label_counts,
    refuse_system_attributes,
    refuse_system_keys,
    required_capabilities,
)

KUBE = {"bc.dev/cap.binding.kubernetes": "*"}
LIMITS = {"bc.dev/cap.devices.limits": "*"}


@pytest.mark.parametrize(
    ("binding", "resources", "enforce", "wanted"),
    [
        ("device", [], False, {}),
        ("device", ["cpu"], False, {}),
        ("device", ["cpu", "memory"], True, LIMITS),
        ("device", [], True, {}),
        ("kubernetes", [], False, KUBE),
        ("kubernetes", ["memory"], True, {**KUBE, **LIMITS}),
        ("node", ["cpu"], True, {}),  # a node binding asks for neither
    ],
)
def test_required_capabilities(binding: str, resources: list[str], enforce: bool, wanted: dict) -> None:
    assert required_capabilities(binding, resources, enforce_device_limits=enforce) == wanted


def test_to_placement_request_carries_them_with_a_modules_labels() -> None:
    body = ReservationRequest.model_validate(
        {
            "tenantId": "t",
            "poolId": "p",
            "resources": {"cpu": 2},
            "duration": "1h",
            "binding": "kubernetes",
            "idempotencyKey": "k",
        }
    )
    now = datetime(2026, 12, 1, tzinfo=UTC)
    request = to_placement_request(
        body, now, enforce_device_limits=True, node_labels={"bc.dev/driver.kvm": "*"}
    )
    assert dict(request.node_labels) == {"bc.dev/driver.kvm": "*", **KUBE, **LIMITS}
    assert dict(to_placement_request(body, now).node_labels) == KUBE


@pytest.mark.parametrize(
    ("key", "source", "counts"),
    [
        ("bc.dev/cap.x", "system", True),
        ("bc.dev/cap.x", "operator", False),
        ("bc.dev/cap.x", None, False),
        ("rack", "operator", True),
        ("rack", None, True),
    ],
)
def test_label_counts(key: str, source: str | None, counts: bool) -> None:
    assert label_counts(key, source) is counts


def test_hello_labels_and_refusal() -> None:
    assert hello_system_labels([("nvidia", "580.159.04", ["gpu", "mig"])], ["devices.limits"]) == {
        "bc.dev/driver.nvidia": "580.159.04",
        "bc.dev/driver-kind.nvidia.gpu": "1",
        "bc.dev/driver-kind.nvidia.mig": "1",
        "bc.dev/cap.devices.limits": "1",
    }
    refuse_system_keys({"rack": "r1", "bcdev/x": "1"})
    with pytest.raises(InvalidInput) as info:
        refuse_system_keys({"rack": "r1", "bc.dev/cap.x": "1"})
    assert info.value.details == {"path": "labels.bc.dev/cap.x", "key": "bc.dev/cap.x"}
    assert info.value.message == (
        "label bc.dev/cap.x is in the reserved bc.dev/ namespace: only the service writes it "
        "(from an agent's Hello)"
    )


def test_device_attribute_refusal() -> None:
    refuse_system_attributes([{"model": "H100"}, {}])
    with pytest.raises(InvalidInput) as info:
        refuse_system_attributes([{"model": "H100"}, {"bc.dev/cap.x": "1"}], path="nodes.0.devices")
    assert info.value.details == {"path": "nodes.0.devices.1.attributes.bc.dev/cap.x", "key": "bc.dev/cap.x"}
    assert info.value.message == (
        "device attribute bc.dev/cap.x is in the reserved bc.dev/ namespace: only the service writes it, "
        "as a system label (from an agent's Hello)"
    )
