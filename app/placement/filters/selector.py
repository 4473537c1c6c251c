"""Filter 5, ``selector``: enough atoms of the class match the device request's selector.
Reason: ``selector: <k> of <total> <class> match`` (total = the node's atoms of the class).

The match masks are derived once per node (:func:`app.placement.derived.matches`, cached per inventory
object and selector); this filter only judges them.
"""

from __future__ import annotations

from app.placement.context import NodeWork, PlanContext

NAME = "selector"
# what it reads of the request and the node (docs/extending.md, "What a filter reads")
REQUEST_READS: tuple[str, ...] = ("devices", "devices.device_class", "devices.count", "devices.selector")
NODE_READS: tuple[str, ...] = ()
READS = ("classes", "match_masks")
AFTER: tuple[str, ...] = ()


def applies(ctx: PlanContext) -> bool:
    """Only a device request with a selector can be rejected here."""
    return any(ctx.selector_tokens)


def check(ctx: PlanContext, work: NodeWork) -> str | None:
    """Reject when fewer atoms of a device request's class match its selector than its count."""
    tokens = ctx.selector_tokens
    for i, device in enumerate(ctx.devices):
        if not tokens[i]:
            continue
        ct = work.classes[i]
        if ct is None:
            return f"selector: 0 of 0 {device.device_class} match"
        matching = work.match_masks[i].bit_count()
        if matching < device.count:
            return f"selector: {matching} of {len(ct.atom_ids)} {device.device_class} match"
    return None
