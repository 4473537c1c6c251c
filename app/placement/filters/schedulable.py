"""Filter 1, ``schedulable``: the node's NoSchedule reasons, minus a dedication to the request's own
tenant; the reason text is the NoSchedule reasons themselves (``cordoned, heartbeat lost``). A
``binding: 'node'`` request (a whole-node lease) uses the lease rule instead, which ignores every reason
but foreign dedications and needs ``leasable``."""

from __future__ import annotations

from app.placement.context import NodeWork, PlanContext
from app.placement.schedulable import ineligibility, lease_ineligibility

NAME = "schedulable"
# what it reads of the request and the node (docs/extending.md, "What a filter reads")
REQUEST_READS: tuple[str, ...] = ("tenant_id", "binding")
NODE_READS: tuple[str, ...] = ("state.no_schedule_reasons", "state.leasable")
READS: tuple[str, ...] = ()
AFTER: tuple[str, ...] = ()


def check(ctx: PlanContext, work: NodeWork) -> str | None:
    """``None`` when the node is schedulable for the request's tenant, else the NoSchedule reasons."""
    if ctx.request.binding == "node":
        return lease_ineligibility(work.node, ctx.pool, ctx.request.tenant_id)
    return ineligibility(work.node, ctx.pool, ctx.request.tenant_id)
