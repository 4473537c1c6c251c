"""Filter 7, ``topology``: a ``topology: 'nvlink-all'`` request for more than one atom needs the default
pick's worst link to be NV (docs/placement-rules.md, "Atom pick and NVLink").
Reason: ``topology: no NVLink-complete set of <n> <class>``.

It computes the default pick itself (memoized in :func:`app.placement.topology.pick`, so the picker's
own call is a dictionary hit) and writes nothing."""

from __future__ import annotations

from app.placement.context import NodeWork, PlanContext
from app.placement.model import NVLINK_ALL
from app.placement.topology import NV, pick

NAME = "topology"
# what it reads of the request and the node (docs/extending.md, "What a filter reads")
REQUEST_READS: tuple[str, ...] = ("devices", "devices.device_class", "devices.count", "devices.topology")
NODE_READS: tuple[str, ...] = ()
READS = ("classes", "free_masks")
AFTER = ("fits",)  # the pick needs count <= free atoms


def applies(ctx: PlanContext) -> bool:
    return any(d.topology == NVLINK_ALL and d.count > 1 for d in ctx.devices)


def check(ctx: PlanContext, work: NodeWork) -> str | None:
    """Reject when the default pick of an nvlink-all request is not NV-complete."""
    for i, device in enumerate(ctx.devices):
        if device.topology != NVLINK_ALL or device.count < 2:
            continue
        ct = work.classes[i]
        assert ct is not None  # fits rejected a node without atoms of the class
        if pick(ct, work.free_masks[i], device.count).worst_link != NV:
            return f"topology: no NVLink-complete set of {device.count} {device.device_class}"
    return None
