"""Inventory request bodies (docs/api.md, "HTTP API", Inventory)."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from app.jsonnum import JsonDecimal
from app.placement.model import NUMA_NODE_ATTRIBUTE, selectable_attributes

LABEL_KEY = r"^[A-Za-z][A-Za-z0-9._/-]*$"
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
# Kubernetes label sizes (docs/api.md, "Limits"): a key is ``[prefix/]name`` with a prefix of at most
# 253 and a name of at most 63 characters; a value holds at most 63 characters. A node holds at most 256
# labels (operator and system together) and 64 taints.
MAX_LABEL_PREFIX, MAX_LABEL_NAME, MAX_LABEL_VALUE = 253, 63, 63
MAX_LABELS, MAX_TAINTS = 256, 64
MAX_LABEL_KEY = MAX_LABEL_PREFIX + 1 + MAX_LABEL_NAME
# LABEL_KEY and both sizes in one pattern, for the OpenAPI document: ``[prefix/]name`` where the prefix
# (up to the last '/') holds at most 253 characters and the name at most 63
# (no lookahead: test generators such as schemathesis search lookahead patterns by filtering, slowly)
SIZED_LABEL_KEY = (
    rf"^(?:[A-Za-z][A-Za-z0-9._/-]{{0,{MAX_LABEL_PREFIX - 1}}}/[A-Za-z0-9._-]{{0,{MAX_LABEL_NAME}}}"
    rf"|[A-Za-z][A-Za-z0-9._-]{{0,{MAX_LABEL_NAME - 1}}})$"
)
MAX_NUMA_NODE = 1024
MAX_DEVICES, MAX_LINKS = 1024, 1024 * 64  # per node: atoms, and device-device links


def _label_key_sizes(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if len(name) > MAX_LABEL_NAME:
        raise ValueError(f"a label key's name (after the last '/') holds at most {MAX_LABEL_NAME} characters")
    if len(prefix) > MAX_LABEL_PREFIX:
        raise ValueError(
            f"a label key's prefix (before the last '/') holds at most {MAX_LABEL_PREFIX} characters"
        )
    return key


LabelKey = Annotated[
    str,
    Field(pattern=LABEL_KEY, max_length=MAX_LABEL_KEY),
    AfterValidator(_label_key_sizes),
    WithJsonSchema({"type": "string", "pattern": SIZED_LABEL_KEY, "maxLength": MAX_LABEL_KEY}),
]
LabelValue = Annotated[str, Field(max_length=MAX_LABEL_VALUE)]
Labels = Annotated[dict[LabelKey, LabelValue], Field(max_length=MAX_LABELS)]
Amount = Annotated[Decimal, JsonDecimal(ge=0, max_digits=24, decimal_places=6)]


class PoolCreate(BaseModel):
    """``POST /v1/pools`` body."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=128, pattern=NAME)


class TaintBody(BaseModel):
    """A node taint; ``dedicated=<tenant>`` with NoSchedule dedicates the node to that tenant."""

    model_config = ConfigDict(extra="forbid")
    key: LabelKey
    value: LabelValue = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class ResourceBody(BaseModel):
    """A scalar resource: room over a window = floor(allocatable x ratio) - the peak held in it
    (docs/placement-rules.md,
    scalar room, counted per instant)."""

    model_config = ConfigDict(extra="forbid")
    allocatable: Amount
    ratio: Annotated[Decimal, JsonDecimal(gt=0, le=1000, max_digits=12, decimal_places=6)] = Decimal(1)


class DeviceBody(BaseModel):
    """One atom: ``GPU-<uuid>`` / ``MIG-<uuid>`` (``parent`` names the GPU of a MIG slice)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
    device_class: str = Field(alias="class", default="gpu", pattern=r"^[a-z][a-z0-9._-]*$", max_length=64)
    attributes: dict[LabelKey, Annotated[str, Field(max_length=1024)] | int | float | bool] = Field(
        default_factory=dict, max_length=MAX_LABELS
    )
    numaNode: int | None = Field(default=None, ge=0, le=MAX_NUMA_NODE, validate_default=True)
    parent: str | None = None
    healthy: bool = True
    bookable: bool = True

    @field_validator("attributes")
    @classmethod
    def _numa_attribute_is_a_numa_node(cls, attributes: dict[str, Any]) -> dict[str, Any]:
        attribute = attributes.get(NUMA_NODE_ATTRIBUTE)
        whole = isinstance(attribute, int) and not isinstance(attribute, bool)
        if attribute is not None and (not whole or not 0 <= attribute <= MAX_NUMA_NODE):
            raise ValueError(f"attributes.numaNode must be an integer from 0 to {MAX_NUMA_NODE}")
        return attributes

    @field_validator("numaNode")
    @classmethod
    def _one_numa_node(cls, numa: int | None, info: ValidationInfo) -> int | None:
        """``numaNode`` and the attribute ``numaNode`` are one fact (docs/selectors.md): either may be
        given, both only when equal."""
        attribute = (info.data.get("attributes") or {}).get(NUMA_NODE_ATTRIBUTE)
        if attribute is None:
            return numa
        if numa is not None and numa != attribute:
            raise ValueError(f"numaNode {numa} disagrees with attributes.numaNode {attribute}")
        return int(attribute)

    @model_validator(mode="after")
    def _numa_attribute(self) -> DeviceBody:
        # stored as selectors read it: the NUMA node is also the attribute numaNode on every path
        self.attributes = dict(selectable_attributes(self.attributes, self.numaNode))
        return self


class LinkBody(BaseModel):
    """A pairwise link between two atoms of the node, as nvidia-smi prints it (NV#, PIX, ... SYS)."""

    model_config = ConfigDict(extra="forbid")
    a: str
    b: str
    link: str = Field(pattern=r"^(NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")


class NodeCreate(BaseModel):
    """``POST /v1/pools/{poolId}/nodes`` body."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=128, pattern=NAME)
    labels: Labels = Field(default_factory=dict)
    taints: list[TaintBody] = Field(default_factory=list, max_length=MAX_TAINTS)
    cordoned: bool = False
    leasable: bool = True
    resources: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9._/-]*$", max_length=64)], ResourceBody] = (
        Field(default_factory=dict)
    )
    devices: list[DeviceBody] = Field(default_factory=list, max_length=MAX_DEVICES)
    links: list[LinkBody] = Field(default_factory=list, max_length=MAX_LINKS)

    @field_validator("devices")
    @classmethod
    def _unique_ids(cls, devices: list[DeviceBody]) -> list[DeviceBody]:
        seen: set[str] = set()
        for d in devices:
            if d.id in seen:
                raise ValueError(f"device id {d.id} appears twice; device ids are unique within a node")
            seen.add(d.id)
        return devices

    @model_validator(mode="after")
    def _consistent(self) -> NodeCreate:
        known = {d.id for d in self.devices}
        for d in self.devices:
            if d.parent is not None and d.parent not in known:
                raise ValueError(f"device {d.id} names an unknown parent {d.parent}")
        for link in self.links:
            if link.a not in known or link.b not in known or link.a == link.b:
                raise ValueError(f"link {link.a}-{link.b} must join two distinct devices of this node")
        return self


class NodeImport(BaseModel):
    """``POST /v1/pools/{poolId}/nodes/import``: a node from ``nvidia-smi topo -m`` (+ ``-q -x``)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=128, pattern=NAME)
    topo: str = Field(min_length=1, max_length=1_000_000)
    nvidiaSmiXml: str | None = Field(default=None, max_length=20_000_000)
    labels: Labels = Field(default_factory=dict)
    taints: list[TaintBody] = Field(default_factory=list, max_length=MAX_TAINTS)
    resources: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9._/-]*$", max_length=64)], ResourceBody] = (
        Field(default_factory=dict)
    )


class LabelsBody(BaseModel):
    """``PUT /v1/nodes/{nodeId}/labels``: the node's operator labels (system labels are kept)."""

    model_config = ConfigDict(extra="forbid")
    labels: Labels


class TaintsBody(BaseModel):
    """``PUT /v1/nodes/{nodeId}/taints``: the node's whole taint list."""

    model_config = ConfigDict(extra="forbid")
    taints: list[TaintBody] = Field(max_length=MAX_TAINTS)


class DeviceHealth(BaseModel):
    """Health of one atom."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=128)
    healthy: bool | None = None
    bookable: bool | None = None


class HealthBody(BaseModel):
    """``POST /v1/nodes/{nodeId}/health``: node conditions and per-atom health."""

    model_config = ConfigDict(extra="forbid")
    ready: bool | None = None
    heartbeatLost: bool | None = None
    devices: list[DeviceHealth] = Field(default_factory=list, max_length=1024)


def jsonable_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """Attributes as stored in ``devices.attributes`` (JSON scalars only)."""
    return {k: v for k, v in attributes.items() if isinstance(v, (str, int, float, bool))}


# ------------------------------------------------------------------------------------- node agents

AGENT_NAME = r"^[a-z][a-z0-9._-]*$"
AgentToken = Annotated[str, Field(min_length=1, max_length=64, pattern=AGENT_NAME)]
ErrorText = Annotated[str, Field(min_length=1, max_length=2000)]


class DriverBody(BaseModel):
    """A driver the agent's host serves: ``{id: "nvidia", version: "580.159.04", kinds: ["gpu"]}``;
    becomes ``bc.dev/driver.<id>=<version>`` and ``bc.dev/driver-kind.<id>.<kind>=1``."""

    model_config = ConfigDict(extra="forbid")
    id: AgentToken
    version: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._+:~-]*$")
    kinds: list[AgentToken] = Field(default_factory=list, max_length=32)


class HelloBody(BaseModel):
    """``POST /v1/nodes/hello``: a node agent's registration (creates or updates the node by pool and name).

    ``topo`` is ``nvidia-smi topo -m`` text and ``nvidiaSmiXml`` ``nvidia-smi -q -x`` (parsed by the
    importer); ``capabilities`` become ``bc.dev/cap.<c>=1``; ``labels`` are free labels (never
    ``bc.dev/``); ``resources`` (cpu cores, memory MiB) are taken when the node is created;
    ``intervalSeconds`` is the agent's heartbeat interval; ``error`` reports a failure (nvidia-smi failed):
    the node is then ``not ready``, and ``topo`` may be left out (the inventory stays as it was).
    """

    model_config = ConfigDict(extra="forbid")
    poolId: str = Field(min_length=1, max_length=128)
    name: str = Field(min_length=1, max_length=128, pattern=NAME)
    topo: str | None = Field(default=None, min_length=1, max_length=1_000_000)
    nvidiaSmiXml: str | None = Field(default=None, max_length=20_000_000)
    drivers: list[DriverBody] = Field(default_factory=list, max_length=16)
    capabilities: list[AgentToken] = Field(default_factory=list, max_length=64)
    labels: Labels = Field(default_factory=dict)
    resources: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9._/-]*$", max_length=64)], ResourceBody] = (
        Field(default_factory=dict)
    )
    intervalSeconds: int = Field(default=10, ge=1, le=3600)
    error: ErrorText | None = None

    @model_validator(mode="after")
    def _topo_unless_failed(self) -> HelloBody:
        if self.topo is None and self.error is None:
            raise ValueError("topo is required unless error reports why it could not be read")
        if self.nvidiaSmiXml is not None and self.topo is None:
            raise ValueError("nvidiaSmiXml needs topo")
        ids = [d.id for d in self.drivers]
        if len(set(ids)) != len(ids):
            raise ValueError("each driver id appears once")
        return self


class HeartbeatDevice(BaseModel):
    """One atom's health as the agent sees it; ``reason`` says why it is unhealthy."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=128)
    healthy: bool
    reason: str | None = Field(default=None, max_length=256)


class HeartbeatBody(BaseModel):
    """``POST /v1/nodes/{nodeId}/heartbeat``: device health; ``error`` when nvidia-smi failed (not ready)."""

    model_config = ConfigDict(extra="forbid")
    devices: list[HeartbeatDevice] = Field(default_factory=list, max_length=1024)
    error: ErrorText | None = None

    @field_validator("devices")
    @classmethod
    def _unique(cls, devices: list[HeartbeatDevice]) -> list[HeartbeatDevice]:
        if len({d.id for d in devices}) != len(devices):
            raise ValueError("each device id appears once")
        return devices


class AgentDevice(BaseModel):
    """An atom as Hello left it."""

    id: str
    device_class: str = Field(alias="class", serialization_alias="class")
    healthy: bool
    bookable: bool

    model_config = ConfigDict(populate_by_name=True)


class HelloAnswer(BaseModel):
    """What Hello did: the node, whether it was created, whether its static inventory changed (then the
    pool's inventory version was bumped), its labels, reasons and devices, and the importer's warnings."""

    nodeId: str
    poolId: str
    name: str
    created: bool
    inventoryChanged: bool
    intervalSeconds: int
    labels: dict[str, str]
    labelSources: dict[str, str]
    noScheduleReasons: list[str]
    devices: list[AgentDevice]
    warnings: list[str]


class HeartbeatAnswer(BaseModel):
    """What a heartbeat did: ``changed`` is False when it only recorded the time (one statement)."""

    nodeId: str
    changed: bool
    noScheduleReasons: list[str]


class DrainBody(BaseModel):
    """``POST /v1/nodes/{id}/drain`` body (optional): ``reschedule`` moves the node's future reservations
    (windows not started yet) to other nodes, or back to pending (docs/operating.md, "Maintenance: drain
    and delete")."""

    model_config = ConfigDict(extra="forbid")
    reschedule: StrictBool = False
