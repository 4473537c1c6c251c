"""Filter 6, ``fits``: enough matching atoms are free, that is healthy, bookable and unbooked over the
whole ``[start, end)`` window (the I/O half puts the others in ``state.unavailable`` / ``state.booked``).
Reason: ``fits: <free> of <total> <class> free`` (total = atoms of the class matching the selector)."""

from __future__ import annotations

from app.placement.context import NodeWork, PlanContext

NAME = "fits"


def check(ctx: PlanContext, work: NodeWork) -> str | None:
    """Fill ``work.available_masks`` (free atoms of the class, selector aside) and ``work.free_masks``
    (free and matching); reject when fewer are free than the count."""
    if not ctx.devices:
        return None
    state = work.node.state
    unavailable, booked = state.unavailable, state.booked
    for i, device in enumerate(ctx.devices):
        ct = work.classes[i]
        if ct is None:
            available = 0
        elif not unavailable and not booked:
            available = ct.full_mask
        else:
            available = ct.full_mask
            for atom_id, j in ct.index.items():
                if atom_id in unavailable or atom_id in booked:
                    available &= ~(1 << j)
        work.available_masks.append(available)
        matching = work.match_masks[i]
        free = available & matching
        work.free_masks.append(free)
        n_free = free.bit_count()
        if n_free < device.count:
            return f"fits: {n_free} of {matching.bit_count()} {device.device_class} free"
    return None
