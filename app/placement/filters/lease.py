"""Filter 9, ``lease`` (``binding: node`` only): a whole-node lease takes every atom and all scalar room of
the node for its window (docs/lifecycle.md), so it cannot take a node that holds
anything in that window. Reasons: ``lease: <n> of <total> atoms booked in the window``, ``lease:
<resource> holds <n> in the window``. Other bindings pass. :func:`whole_node` is what a lease claims."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_FLOOR, Decimal

from app.placement.context import NodeWork, PlanContext, amount_decimal
from app.placement.filters.scalars import format_amount
from app.placement.model import NodeSnapshot

NAME = "lease"
# what it reads of the request and the node (docs/extending.md, "What a filter reads")
REQUEST_READS: tuple[str, ...] = ("binding",)
NODE_READS: tuple[str, ...] = ("inventory.atoms", "state.booked", "state.resources")
NODE_BINDING = "node"
READS: tuple[str, ...] = ()
AFTER: tuple[str, ...] = ()


def applies(ctx: PlanContext) -> bool:
    return ctx.request.binding == NODE_BINDING


def check(ctx: PlanContext, work: NodeWork) -> str | None:
    """Why a whole-node lease cannot take the node in the window, or None (always None for others)."""
    if ctx.request.binding != NODE_BINDING:
        return None
    node = work.node
    atoms = node.inventory.atoms
    booked = sum(1 for a in atoms if a.id in node.state.booked)
    if booked:
        return f"lease: {booked} of {len(atoms)} atoms booked in the window"
    for name, resource in sorted(node.state.resources.items()):
        held = amount_decimal(resource.allocated)
        if held > 0:
            return f"lease: {name} holds {format_amount(held)} in the window"
    return None


def whole_node(
    node: NodeSnapshot, atoms_by_request: tuple[tuple[str, ...], ...]
) -> tuple[tuple[tuple[str, ...], ...], Mapping[str, Decimal], tuple[str, ...]]:
    """What a lease of ``node`` claims: the picked atoms per device request plus one more group with
    every other available (healthy, bookable) atom of the node, the whole room of every scalar
    resource (``floor(allocatable x ratio)``; nothing is held in the window, :func:`check`), and the
    held atoms: every unavailable (unhealthy or unbookable) atom of the node, which the lease books
    without using so that nothing else can book it once it heals (docs/lifecycle.md, "Whole-node
    leases")."""
    picked = {a for group in atoms_by_request for a in group}
    rest = tuple(
        a.id for a in node.inventory.atoms if a.id not in picked and a.id not in node.state.unavailable
    )
    held = tuple(a.id for a in node.inventory.atoms if a.id not in picked and a.id in node.state.unavailable)
    room = {
        name: (amount_decimal(r.allocatable) * amount_decimal(r.ratio)).to_integral_value(
            rounding=ROUND_FLOOR
        )
        for name, r in sorted(node.state.resources.items())
    }
    return (*atoms_by_request, rest), {k: v for k, v in room.items() if v > 0}, held
