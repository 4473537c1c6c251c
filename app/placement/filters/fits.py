"""Filter 6, ``fits``: enough matching atoms are free, that is healthy, bookable and unbooked over the
whole ``[start, end)`` window (the I/O half puts the others in ``state.unavailable`` / ``state.booked``;
the masks are derived in :func:`app.placement.derived.free`).
Reason: ``fits: <free> of <total> <class> free`` (total = atoms of the class matching the selector)."""

from __future__ import annotations

from app.placement.context import NodeWork, PlanContext

NAME = "fits"
# what it reads of the request and the node (docs/extending.md, "What a filter reads")
REQUEST_READS: tuple[str, ...] = ("devices", "devices.device_class", "devices.count")
NODE_READS: tuple[str, ...] = ()
READS = ("match_masks", "free_masks")
AFTER = ("selector",)  # a selector short of matches is reported as such, not as too few free


def applies(ctx: PlanContext) -> bool:
    return bool(ctx.devices)


def check(ctx: PlanContext, work: NodeWork) -> str | None:
    """Reject when fewer matching atoms are free than a device request's count."""
    free_masks = work.free_masks
    for i, device in enumerate(ctx.devices):
        n_free = free_masks[i].bit_count()
        if n_free < device.count:
            return reason(n_free, work.match_masks[i].bit_count(), device.device_class)
    return None


def reason(free: int, total: int, device_class: str) -> str:
    """``fits: <free> of <total> <class> free``: the one home of the text (the picker reports a device
    request left short by an earlier one of its class with it too)."""
    return f"fits: {free} of {total} {device_class} free"
