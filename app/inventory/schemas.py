"""Inventory request bodies (DESIGN.md, "HTTP API", Inventory)."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

LABEL_KEY = r"^[A-Za-z][A-Za-z0-9._/-]*$"
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
# Kubernetes label sizes (docs/api.md, "Limits"): a key is ``[prefix/]name`` with a prefix of at most
# 253 and a name of at most 63 characters; a value holds at most 63 characters. A node holds at most 256
# labels (operator and system together) and 64 taints.
MAX_LABEL_PREFIX, MAX_LABEL_NAME, MAX_LABEL_VALUE = 253, 63, 63
MAX_LABELS, MAX_TAINTS = 256, 64


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
    Field(pattern=LABEL_KEY, max_length=MAX_LABEL_PREFIX + 1 + MAX_LABEL_NAME),
    AfterValidator(_label_key_sizes),
]
LabelValue = Annotated[str, Field(max_length=MAX_LABEL_VALUE)]
Labels = Annotated[dict[LabelKey, LabelValue], Field(max_length=MAX_LABELS)]
Amount = Annotated[Decimal, Field(ge=0, max_digits=24, decimal_places=6, allow_inf_nan=False)]


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
    """A scalar resource: room = floor(allocatable x ratio) - allocated (seed 000, scalar room)."""

    model_config = ConfigDict(extra="forbid")
    allocatable: Amount
    ratio: Annotated[Decimal, Field(gt=0, le=1000, max_digits=12, decimal_places=6, allow_inf_nan=False)] = (
        Decimal(1)
    )


class DeviceBody(BaseModel):
    """One atom: ``GPU-<uuid>`` / ``MIG-<uuid>`` (``parent`` names the GPU of a MIG slice)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
    device_class: str = Field(alias="class", default="gpu", pattern=r"^[a-z][a-z0-9._-]*$", max_length=64)
    attributes: dict[LabelKey, Annotated[str, Field(max_length=1024)] | int | float | bool] = Field(
        default_factory=dict, max_length=MAX_LABELS
    )
    numaNode: int | None = Field(default=None, ge=0, le=1024)
    parent: str | None = None
    healthy: bool = True
    bookable: bool = True


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
    devices: list[DeviceBody] = Field(default_factory=list, max_length=1024)
    links: list[LinkBody] = Field(default_factory=list, max_length=1024 * 64)

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
