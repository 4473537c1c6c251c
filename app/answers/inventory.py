"""Inventory answers: pools, nodes, devices, links (docs/api.md, "HTTP API", response shapes)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from app.answers.common import NEXT_CURSOR, ApiModel, Number, Timestamp

AttributeValue = str | bool | int | float


class CapacityRollup(ApiModel):
    """One resource of a pool's capacity rollup: ``total`` and ``allocated`` (atoms or scalar units)."""

    total: Number
    allocated: Number


class Pool(ApiModel):
    """A pool with its node count and capacity rollup by resource."""

    id: str
    name: str
    createdAt: Timestamp = Field(description="ISO 8601")
    archivedAt: Timestamp | None = Field(description="ISO 8601; null while the pool is active")
    nodeCount: int
    capacity: dict[str, CapacityRollup]


class PoolList(ApiModel):
    """A page of pools the caller may read, oldest first."""

    items: list[Pool]
    nextCursor: str | None = NEXT_CURSOR


class Taint(ApiModel):
    """A node taint; ``dedicated=<tenant>`` with NoSchedule dedicates the node to that tenant."""

    key: str
    value: str
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class NodeResource(ApiModel):
    """A scalar resource of a node: room = floor(allocatable x ratio) - allocated."""

    allocatable: Number
    ratio: Number
    allocated: Number


class Device(ApiModel):
    """One atom (a GPU or a MIG slice, whose ``parent`` is its GPU)."""

    # the service builds it by the field's name (``device_class=``); JSON names it ``class``
    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True)

    id: str
    device_class: str = Field(alias="class")
    attributes: dict[str, AttributeValue]
    numaNode: int | None
    parent: str | None
    healthy: bool
    bookable: bool
    healthReason: str | None = Field(
        default=None, description="why the atom is unhealthy, as its agent or the health route said"
    )


class Link(ApiModel):
    """The link between two atoms as nvidia-smi prints it (``NV4``, ``PIX``, ... ``SYS``)."""

    a: str
    b: str
    link: str


class DeviceClassUsage(ApiModel):
    """A node's atoms of one class at the database's now: ``allocated`` booked now, ``free`` healthy,
    bookable and not booked now, ``unhealthy`` not healthy (booked or not). An atom healthy but not
    bookable is neither free nor unhealthy, so ``total`` >= ``allocated`` + ``free``."""

    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True)

    device_class: str = Field(alias="class")
    total: int
    allocated: int
    free: int
    unhealthy: int


class ScalarUsage(ApiModel):
    """A node's scalar resource at the database's now: ``capacity`` floor(allocatable x ratio),
    ``allocated`` held now, ``free`` = max(capacity - allocated, 0)."""

    resource: str
    capacity: Number
    allocated: Number
    free: Number


DrainState = Literal["draining", "drained"] | None
DRAIN_FIELD = Field(
    default=None,
    description="null: not drained; `draining`: drained, with work placed on it that is current or "
    "future; `drained`: drained and holding nothing current or future (it may be deleted). "
    "docs/operating.md, Maintenance: drain and delete",
)


class NodeAgent(ApiModel):
    """The node's agent (docs/agent.md): its heartbeat interval, last heartbeat and last reported error."""

    intervalSeconds: float
    lastHeartbeatAt: Timestamp | None = Field(description="ISO 8601; null before the first heartbeat")
    error: str | None = Field(description="the failure the agent last reported (e.g. nvidia-smi failed)")


class Node(ApiModel):
    """A node with its labels (and their source), taints, conditions, resources, devices and links."""

    id: str
    poolId: str
    name: str
    labels: dict[str, str]
    labelSources: dict[str, Literal["system", "operator"]]
    taints: list[Taint]
    cordoned: bool
    ready: bool
    heartbeatLost: bool
    leasable: bool
    noScheduleReasons: list[str]
    drain: DrainState = DRAIN_FIELD
    agent: NodeAgent | None = Field(
        default=None, description="null for a node an operator registered without an agent"
    )
    resources: dict[str, NodeResource]
    deviceClasses: list[DeviceClassUsage] = Field(description="atoms by class, at the database's now")
    scalars: list[ScalarUsage] = Field(description="scalar resources by name, at the database's now")
    devices: list[Device]
    links: list[Link]


class ImportedNode(Node):
    """The node an import created, with the warnings of cells outside the GPU x GPU block it left out."""

    warnings: list[str]


class NodeSummary(ApiModel):
    """A node in a pool's node list: ``devices`` counts atoms by class; ``deviceClasses`` and ``scalars``
    say what is allocated and free at the database's now."""

    id: str
    name: str
    cordoned: bool
    ready: bool
    heartbeatLost: bool
    lastHeartbeat: Timestamp | None = Field(description="ISO 8601; null before an agent's first heartbeat")
    noScheduleReasons: list[str]
    drain: DrainState = DRAIN_FIELD
    labels: dict[str, str]
    devices: dict[str, int]
    deviceClasses: list[DeviceClassUsage] = Field(description="atoms by class, at the database's now")
    scalars: list[ScalarUsage] = Field(description="scalar resources by name, at the database's now")


class RescheduledReservation(ApiModel):
    """A future reservation a drain with ``reschedule`` moved off the node (docs/operating.md,
    "Maintenance: drain and delete"): to ``toNodeId``, or back to ``pending`` (``toNodeId`` null)."""

    reservationId: str
    result: Literal["other_node", "pending", "kept"] = Field(
        description="`other_node`: placed elsewhere for the same window; `pending`: nothing else fits, "
        "it waits for a wake; `kept`: not moved (a gang), it keeps its window on the node"
    )
    fromNodeId: str
    toNodeId: str | None


class DrainedNode(Node):
    """The node a drain answered, with the future reservations it moved (empty without ``reschedule``)."""

    rescheduled: list[RescheduledReservation]


class NodeList(ApiModel):
    """A page of a pool's nodes in id order."""

    items: list[NodeSummary]
    nextCursor: str | None = NEXT_CURSOR
