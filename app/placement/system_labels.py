"""The one home of the ``bc.dev/`` system-label rule (docs/placement-rules.md, nodeLabels and
requiredCapabilities).

Labels under ``bc.dev/`` are written only by the service itself, with source ``system``, at every Hello of a
node's agent (:mod:`app.inventory.hello`): ``bc.dev/driver.<id>=<version>`` for each driver the agent
advertises, ``bc.dev/driver-kind.<id>.<kind>=1`` for each kind it serves and ``bc.dev/cap.<capability>=1``
for each capability. No operator route may write one (:func:`refuse_system_keys`), no device attribute may
carry such a key on any registration path (:func:`refuse_system_attributes`), and a ``bc.dev/`` label
whose source is not ``system`` is never read as one (:func:`label_counts`), so an operator cannot fake a
capability. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from app.errors import InvalidInput

SYSTEM_PREFIX = "bc.dev/"
SYSTEM_SOURCE = "system"
OPERATOR_SOURCE = "operator"
ANY_LABEL_VALUE = "*"

CAP_DEVICES_LIMITS = "devices.limits"
CAP_BINDING_KUBERNETES = "binding.kubernetes"


def is_system_key(key: str) -> bool:
    """True for a key in the reserved ``bc.dev/`` namespace."""
    return key.startswith(SYSTEM_PREFIX)


def label_counts(key: str, source: str | None) -> bool:
    """Whether a node label with this key and source may be read by placement: a ``bc.dev/`` label only
    when its source is ``system``; every other label whatever its source."""
    return not is_system_key(key) or source == SYSTEM_SOURCE


def unmet_label(
    wanted: Iterable[tuple[str, str]], labels: Mapping[str, str], sources: Mapping[str, str]
) -> str | None:
    """The one labels rule (docs/placement-rules.md, nodeLabels): why the first ``(key, value)`` of
    ``wanted`` (in its
    order) is not met by a node's ``labels`` (key -> value) and ``sources`` (key -> ``system`` /
    ``operator``), or ``None`` when all are. ``'*'`` asks only that the label exist; a ``bc.dev/`` label
    that is not ``system`` does not exist (:func:`label_counts`). Reasons: ``missing <key>``,
    ``<key> is <value>, want <wanted>``. The ``labels`` filter prefixes ``labels: ``; the guarded commit
    re-checks under its lock that the answer is still ``None``."""
    for key, value in wanted:
        have = labels.get(key)
        if have is None or not label_counts(key, sources.get(key)):
            return f"missing {key}"
        if value != ANY_LABEL_VALUE and have != value:
            return f"{key} is {have}, want {value}"
    return None


def driver_label(driver_id: str) -> str:
    """``bc.dev/driver.<id>`` (its value is the driver's version)."""
    return f"{SYSTEM_PREFIX}driver.{driver_id}"


def driver_kind_label(driver_id: str, kind: str) -> str:
    """``bc.dev/driver-kind.<id>.<kind>`` (value ``1``)."""
    return f"{SYSTEM_PREFIX}driver-kind.{driver_id}.{kind}"


def capability_label(capability: str) -> str:
    """``bc.dev/cap.<capability>`` (value ``1``)."""
    return f"{SYSTEM_PREFIX}cap.{capability}"


def hello_system_labels(
    drivers: Iterable[tuple[str, str, Iterable[str]]], capabilities: Iterable[str]
) -> dict[str, str]:
    """The ``bc.dev/`` labels a Hello writes: ``(driver id, version, kinds)`` triples and capabilities."""
    out: dict[str, str] = {}
    for driver_id, version, kinds in drivers:
        out[driver_label(driver_id)] = version
        for kind in kinds:
            out[driver_kind_label(driver_id, kind)] = "1"
    for capability in capabilities:
        out[capability_label(capability)] = "1"
    return out


def _reserved(subject: str, key: str, path: str, written_as: str = "") -> InvalidInput:
    """The one refusal of a ``bc.dev/`` key written where only the service writes (422, ``path``, details
    ``{"key"}``): ``<subject> <key> is in the reserved bc.dev/ namespace: only the service writes
    it<written_as> (from an agent's Hello)``."""
    return InvalidInput(
        f"{subject} {key} is in the reserved {SYSTEM_PREFIX} namespace: only the service writes it"
        f"{written_as} (from an agent's Hello)",
        path=path,
        details={"key": key},
    )


def refuse_system_keys(labels: Mapping[str, str] | Iterable[str], path: str = "labels") -> None:
    """Raise :class:`~app.errors.InvalidInput` (422, ``path`` = ``<path>.<key>``) naming the first
    ``bc.dev/`` key: operators, imports and agents' free-form labels never write one."""
    for key in labels:
        if is_system_key(key):
            raise _reserved("label", key, f"{path}.{key}")


def refuse_system_attributes(attributes: Iterable[Mapping[str, Any]], path: str = "devices") -> None:
    """Raise :class:`~app.errors.InvalidInput` (422, ``path`` = ``<path>.<i>.attributes.<key>``) naming the
    first ``bc.dev/`` key among the devices' ``attributes`` (one mapping per device, in order). The
    namespace is reserved for the service's system labels; a selector reads an attribute before a label
    of the same key, so an attribute there would fake one (docs/selectors.md)."""
    for i, device_attributes in enumerate(attributes):
        for key in device_attributes:
            if is_system_key(key):
                raise _reserved(
                    "device attribute", key, f"{path}.{i}.attributes.{key}", ", as a system label"
                )


def required_capabilities(
    binding: str, resources: Iterable[str], *, enforce_device_limits: bool
) -> dict[str, str]:
    """The node labels capacity asks for on its own reservations (docs/placement-rules.md,
    requiredCapabilities):
    ``binding: kubernetes`` -> ``bc.dev/cap.binding.kubernetes: '*'``; a request that books host
    resources (any scalar, e.g. cpu or memory) -> ``bc.dev/cap.devices.limits: '*'`` when
    ``enforce_device_limits`` (``BC_CAPACITY_ENFORCE_DEVICE_LIMITS``). A node binding asks for neither."""
    wanted: dict[str, str] = {}
    if binding == "node":
        return wanted
    if binding == "kubernetes":
        wanted[capability_label(CAP_BINDING_KUBERNETES)] = ANY_LABEL_VALUE
    if enforce_device_limits and any(True for _ in resources):
        wanted[capability_label(CAP_DEVICES_LIMITS)] = ANY_LABEL_VALUE
    return wanted
