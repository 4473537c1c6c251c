"""Filter 3, the scheduler plugins' filters, in plugin order then filter order.
Reason: ``<plugin-id>/<filter-id>: <reason>``."""

from __future__ import annotations

from app.placement.context import NodeWork, PlanContext
from app.placement.plugins import filter_rejection

NAME = "plugins"
# the plugins' filters see the whole request and node: undeclared, so the memo is off for a
# request they see (docs/extending.md, "What a filter reads")
REQUEST_READS: tuple[str, ...] | None = None
NODE_READS: tuple[str, ...] | None = None
READS: tuple[str, ...] = ()
AFTER: tuple[str, ...] = ()


def applies(ctx: PlanContext) -> bool:
    return bool(ctx.plugin_filters)


def check(ctx: PlanContext, work: NodeWork) -> str | None:
    """The first plugin filter that rejects the node, with its reason."""
    for plugin_id, plugin_filter in ctx.plugin_filters:
        reason = filter_rejection(plugin_filter.filter(ctx.request, work.node))
        if reason is not None:
            return f"{plugin_id}/{plugin_filter.id}: {reason}"
    return None
