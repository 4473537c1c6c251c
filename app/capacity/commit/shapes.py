"""What a guarded commit takes and gives back, shared by its callers: :class:`Committed` (the
allocation written for a candidate), and what rides along with the last node's statements,
:class:`CommitExtras` (a :class:`QuotaCharge` and a :class:`MarkPlaced`). The commit itself is
:func:`app.capacity.commit.single.commit_placements`; docs/architecture.md lists the commit room."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal


@dataclass(frozen=True, slots=True)
class Committed:
    """The allocation written for a candidate: ``{id, nodeId, atoms, resources, start, end}``."""

    allocation_id: str
    node_id: str
    atoms: tuple[str, ...]
    resources: Mapping[str, Decimal]
    classes: Mapping[str, Decimal] = field(default_factory=dict)  # atoms per device class


@dataclass(frozen=True, slots=True)
class QuotaCharge:
    """What the commit charges to the tenant's quota with its last node: ``amounts`` (resource ->
    amount > 0) over ``[start, end)`` for ``reservation_id``. A refused charge raises 409."""

    tenant_id: str
    pool_id: str
    reservation_id: str
    amounts: Mapping[str, Decimal]
    start: datetime
    end: datetime

    @property
    def wanted(self) -> dict[str, Decimal]:
        return {r: Decimal(n) for r, n in self.amounts.items() if Decimal(n) > 0}


@dataclass(frozen=True, slots=True)
class MarkPlaced:
    """Mark the reservation ``placed`` (conditions ``[]``, ``ends_at`` = ``end``) with the last node's
    writes, so the caller needs no statement of its own."""

    reservation_id: str
    end: datetime


@dataclass(frozen=True, slots=True)
class CommitExtras:
    """What rides along with the last node's statements: the quota charge and the placed mark."""

    charge: QuotaCharge | None = None
    mark: MarkPlaced | None = None


NO_EXTRAS = CommitExtras()
