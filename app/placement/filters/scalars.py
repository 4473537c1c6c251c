"""Filter 4, ``scalars``: room = floor(allocatable x ratio) - allocated, ``allocated`` being the peak
held over the request's window (holdings are counted per instant), in ``Decimal`` so that
100 x 0.29 is 29 as in the SQL guard (docs/placement-rules.md, "Scalar room"); negative room is 0 and a
resource the
node lacks has room 0. Reason: ``scalars: <resource> needs <n>, <room> free``."""

from __future__ import annotations

from decimal import Decimal

from app.placement.context import NodeWork, PlanContext, amount_decimal
from app.placement.model import ScalarResource
from app.placement.scalar_capacity import scalar_capacity

NAME = "scalars"
# what it reads of the request and the node (docs/extending.md, "What a filter reads")
REQUEST_READS: tuple[str, ...] = ("resources",)
NODE_READS: tuple[str, ...] = ("state.resources",)
READS: tuple[str, ...] = ()
AFTER: tuple[str, ...] = ()


def applies(ctx: PlanContext) -> bool:
    return bool(ctx.resources)


ZERO = Decimal(0)


def scalar_room(resource: ScalarResource | None) -> Decimal:
    """``floor(allocatable * ratio) - allocated``, at least 0 (``None``, a missing row, is 0)."""
    if resource is None:
        return ZERO
    room = scalar_capacity(resource.allocatable, resource.ratio) - amount_decimal(resource.allocated)
    return room if room > 0 else ZERO


def format_amount(amount: Decimal) -> str:
    """An amount as people write it: ``Decimal('4.000')`` -> ``4``, ``Decimal('0.50')`` -> ``0.5``."""
    if amount == amount.to_integral_value():
        return str(int(amount))
    return format(amount.normalize(), "f")


def check(ctx: PlanContext, work: NodeWork) -> str | None:
    """The first requested resource (in request order) needing more than the node's room."""
    if not ctx.resources:
        return None
    rows = work.node.state.resources
    for name, amount in ctx.resources:
        room = scalar_room(rows.get(name))
        if amount > room:
            return f"scalars: {name} needs {format_amount(amount)}, {format_amount(room)} free"
    return None
