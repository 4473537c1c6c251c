"""Usage accounting: the GPU-hours and scalar-hours held over a period, split into regular and spot work
(``GET /v1/usage``; docs/operating.md, "Usage accounting")."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from app.answers.common import ApiModel, Number, Timestamp
from app.answers.usage_groups import UsageGroup

BY_NAME = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True)


class SplitHours(ApiModel):
    """Hours held over the period, by regular and spot work. A device class counts atom-hours (one GPU
    or MIG slice held for one hour is 1); a scalar resource counts its amount times hours in its own unit
    (cpu: core-hours; memory: MiB-hours)."""

    regular: Number = Field(description="held by regular (non-spot) work, in hours (see above)")
    spot: Number = Field(description="held by spot work (docs/preemption.md), in hours (see above)")


DEVICE_HOURS = Field(
    description="device class (`gpu`, a MIG profile, ...) -> atom-hours held: one atom for one hour is 1; "
    "a class nothing held is absent"
)
SCALAR_HOURS = Field(
    description="scalar resource -> amount x hours held: cpu in core-hours, memory in MiB-hours, any other "
    "resource in its unit x hours; a resource nothing held is absent"
)


class UsageHours(ApiModel):
    """What was held, by device class and by scalar resource."""

    deviceHours: dict[str, SplitHours] = DEVICE_HOURS
    scalarHours: dict[str, SplitHours] = SCALAR_HOURS


class UsageRow(ApiModel):
    """One group's hours. Only the group's own fields are present: ``tenantId`` (by tenant), ``poolId``
    and ``poolName`` (by pool), ``nodeId``, ``nodeName`` and ``poolId`` (by node), ``resource`` (by
    resource: the device class or scalar resource, whose hours are in the map of its kind)."""

    tenantId: str | None = Field(default=None, description="by tenant: the tenant")
    poolId: str | None = Field(default=None, description="by pool or node: the pool")
    poolName: str | None = Field(default=None, description="by pool: the pool's name")
    nodeId: str | None = Field(default=None, description="by node: the node")
    nodeName: str | None = Field(default=None, description="by node: the node's name")
    resource: str | None = Field(default=None, description="by resource: a device class or scalar resource")
    deviceHours: dict[str, SplitHours] = DEVICE_HOURS
    scalarHours: dict[str, SplitHours] = SCALAR_HOURS


class UsageReport(ApiModel):
    """The hours held over ``[from, to)``: the holdings' stored windows (a release or preemption cut
    their end), each counted only within the period; planned windows of pending reservations are not
    usage. Rows in key order; a group that held nothing in the period has no row."""

    model_config = BY_NAME

    start: Timestamp = Field(alias="from", description="ISO 8601: the period's start")
    end: Timestamp = Field(alias="to", description="ISO 8601: the period's end, exclusive")
    groupBy: UsageGroup
    tenantId: str | None = Field(
        description="only this tenant's usage (a tenant key's own); null: every tenant"
    )
    poolId: str | None = Field(description="only this pool's usage; null: every pool")
    rows: list[UsageRow]
    total: UsageHours = Field(description="the sum of the rows")
