"""A pool's occupancy over a window: what each atom is booked for and what each scalar resource holds,
node by node (``GET /v1/pools/{poolId}/occupancy``; docs/api.md, "Occupancy")."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from app.answers.common import ApiModel, Number, Timestamp

BY_NAME = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True)


class OccupancyBooking(ApiModel):
    """One booking of an atom overlapping the window, with its own window (not cut to the asked one).
    ``reservationId`` and ``tenantId`` are null when the caller may not read that tenant's reservations:
    the atom is shown taken, by someone."""

    start: Timestamp = Field(description="ISO 8601: the booking's start (may lie before `from`)")
    end: Timestamp = Field(description="ISO 8601: the booking's end, exclusive (may lie after `to`)")
    reservationId: str | None = Field(description="null: another tenant's reservation")
    tenantId: str | None = Field(description="null: another tenant's reservation")
    spot: bool = Field(description="spot work, which regular work may preempt (docs/preemption.md)")
    status: str = Field(description="the reservation's status (`ReservationStatus`)")
    planned: bool = Field(
        description="a planned window of a pending reservation (docs/lifecycle.md, 'Planned starts')"
    )


class OccupancyAtom(ApiModel):
    """One atom of a node (a GPU or a MIG slice) and its bookings overlapping the window, by start."""

    model_config = BY_NAME

    atomId: str
    device_class: str = Field(alias="class")
    healthy: bool
    bookable: bool
    bookings: list[OccupancyBooking]


class HeldStep(ApiModel):
    """``held`` is held from ``start`` to ``end`` (exclusive), without change."""

    start: Timestamp = Field(description="ISO 8601")
    end: Timestamp = Field(description="ISO 8601, exclusive")
    held: Number


class OccupancyScalar(ApiModel):
    """A scalar resource of a node: its capacity and what is held over the window as a step function
    (steps holding nothing left out)."""

    resource: str
    capacity: Number = Field(description="floor(allocatable x ratio)")
    steps: list[HeldStep]


class OccupancyNode(ApiModel):
    """A node of the pool: its conditions, its atoms in device order and its scalar resources."""

    nodeId: str
    nodeName: str
    schedulable: bool = Field(description="no NoSchedule reason")
    reasons: list[str] = Field(description="the NoSchedule reasons (docs/reasons.md)")
    ready: bool
    heartbeatLost: bool
    lastHeartbeat: Timestamp | None = Field(
        description="ISO 8601; null for a node without an agent's heartbeat"
    )
    atoms: list[OccupancyAtom]
    scalars: list[OccupancyScalar]


class PoolOccupancy(ApiModel):
    """The pool's nodes (in id order) over ``[from, to)``, read at the database's ``now``."""

    model_config = BY_NAME

    poolId: str
    poolName: str
    start: Timestamp = Field(alias="from", description="ISO 8601: the window's start")
    end: Timestamp = Field(alias="to", description="ISO 8601: the window's end, exclusive")
    now: Timestamp = Field(description="ISO 8601: the database's clock when the answer was read")
    nodes: list[OccupancyNode]
