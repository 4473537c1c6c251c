"""Inventory request bodies (DESIGN.md, "HTTP API", Inventory)."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

LABEL_KEY = r"^[A-Za-z][A-Za-z0-9._/-]*$"
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
LabelKey = Annotated[str, Field(pattern=LABEL_KEY, max_length=253)]
LabelValue = Annotated[str, Field(max_length=253)]
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
    """A scalar resource: room over a window = floor(allocatable x ratio) - the peak held in it (seed 000,
    scalar room, counted per instant)."""

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
    attributes: dict[LabelKey, str | int | float | bool] = Field(default_factory=dict)
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
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    taints: list[TaintBody] = Field(default_factory=list, max_length=64)
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
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    taints: list[TaintBody] = Field(default_factory=list, max_length=64)
    resources: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9._/-]*$", max_length=64)], ResourceBody] = (
        Field(default_factory=dict)
    )


class LabelsBody(BaseModel):
    """``PUT /v1/nodes/{nodeId}/labels``: the node's operator labels (system labels are kept)."""

    model_config = ConfigDict(extra="forbid")
    labels: dict[LabelKey, LabelValue]


class TaintsBody(BaseModel):
    """``PUT /v1/nodes/{nodeId}/taints``: the node's whole taint list."""

    model_config = ConfigDict(extra="forbid")
    taints: list[TaintBody] = Field(max_length=64)


class DeviceHealth(BaseModel):
    """Health of one atom."""

    model_config = ConfigDict(extra="forbid")
    id: str
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
