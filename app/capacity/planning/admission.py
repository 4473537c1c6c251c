"""Intake check of a reservation request against its pool's static inventory (docs/api.md, "Checked at
intake"): the reads half of :mod:`app.placement.intake`. It reads nothing new per request: the pool's
static part comes from the in-process :class:`~app.capacity.planning.snapshot.PoolCache` at the head's
inventory
version (one load per version, shared with planning), and the grouping of its nodes by shape is kept
with that cached version.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.planning.snapshot import PoolCache, PoolHead
from app.errors import InvalidInput, Unsatisfiable
from app.placement.intake import IntakeVerdict, PoolShapes, judge, pool_shapes
from app.placement.model import PlacementRequest, PoolInventory

SHAPES = "intake-shapes"  # PoolInventory.memo key of the pool's PoolShapes


def shapes_of(inventory: PoolInventory) -> PoolShapes:
    """The pool's nodes grouped by static shape, computed once per cached inventory version."""
    found = inventory.memo.get(SHAPES)
    if found is None:
        nodes = [inventory.nodes[node_id] for node_id in inventory.order]
        found = inventory.memo[SHAPES] = pool_shapes(nodes, inventory.capacities)
    assert isinstance(found, PoolShapes)
    return found


def verdict(inventory: PoolInventory, request: PlacementRequest) -> IntakeVerdict:
    """The :class:`IntakeVerdict` of ``request`` on ``inventory`` (pure, on the cached inventory)."""
    return judge(inventory.name or request.pool_id, shapes_of(inventory), request, inventory.memo)


async def read_verdict(
    conn: AsyncConnection, cache: PoolCache, head: PoolHead, request: PlacementRequest
) -> IntakeVerdict:
    """The verdict on the pool at ``head``'s inventory version (or newer); an archived pool gets none
    (its requests stay pending with their own reason)."""
    if head.archived:
        return IntakeVerdict()
    return verdict(await cache.inventory(conn, head), request)


def refusal(found: IntakeVerdict) -> InvalidInput | Unsatisfiable | None:
    """The error a create answers for ``found``: INVALID_INPUT at the field, UNSATISFIABLE, or None."""
    if found.invalid is not None:
        path, message = found.invalid
        return InvalidInput(message, path=path)
    if found.unsatisfiable is not None:
        return Unsatisfiable(found.unsatisfiable)
    return None


async def admit(
    conn: AsyncConnection, cache: PoolCache, head: PoolHead, request: PlacementRequest
) -> tuple[str, ...]:
    """Check ``request`` at intake: raises InvalidInput (``devices.<i>.class``, ``resources.<name>``)
    or Unsatisfiable; else returns its warnings (selector keys nothing in the pool carries)."""
    found = await read_verdict(conn, cache, head, request)
    error = refusal(found)
    if error is not None:
        raise error
    return found.warnings
