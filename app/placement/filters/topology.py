"""Filter 7, ``topology``: a ``topology: 'nvlink-all'`` request for more than one atom needs the default
pick's worst link to be NV (seed 000, "Atom pick and NVLink").
Reason: ``topology: no NVLink-complete set of <n> <class>``."""

from __future__ import annotations

from app.placement.context import NodeWork, PlanContext
from app.placement.model import NVLINK_ALL
from app.placement.topology import NV, pick

NAME = "topology"


def check(ctx: PlanContext, work: NodeWork) -> str | None:
    """Pick for each nvlink-all request (kept in ``work.picks``) and reject when the set is not NV."""
    for i, device in enumerate(ctx.devices):
        if device.topology != NVLINK_ALL or device.count < 2:
            continue
        ct = work.classes[i]
        assert ct is not None  # fits rejected a node without atoms of the class
        chosen = pick(ct, work.free_masks[i], device.count)
        if chosen.worst_link != NV:
            return f"topology: no NVLink-complete set of {device.count} {device.device_class}"
        work.picks[i] = chosen
    return None
