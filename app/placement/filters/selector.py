"""Filter 5, ``selector``: enough atoms of the class match the device request's selector.
Reason: ``selector: <k> of <total> <class> match`` (total = the node's atoms of the class).

The match mask depends only on the static inventory, so it is cached per inventory object and selector.
"""

from __future__ import annotations

from app.placement.context import NodeWork, PlanContext
from app.placement.selectors import selector_matches

NAME = "selector"


def check(ctx: PlanContext, work: NodeWork) -> str | None:
    """Fill ``work.classes`` and ``work.match_masks``; reject when fewer atoms match than the count."""
    topology = work.topology
    if topology is None:
        return None
    classes = topology.classes
    for i, device in enumerate(ctx.devices):
        ct = classes.get(device.device_class)
        work.classes.append(ct)
        token = ctx.selector_tokens[i]
        if ct is None:
            work.match_masks.append(0)
            if token:
                return f"selector: 0 of 0 {device.device_class} match"
            continue
        if not token:
            work.match_masks.append(ct.full_mask)
            continue
        key = (device.device_class, token)
        mask = topology.selector_masks.get(key)
        if mask is None:
            inventory = work.node.inventory
            atoms = {a.id: a for a in inventory.atoms}
            mask = 0
            for j, atom_id in enumerate(ct.atom_ids):
                if selector_matches(device.selector, atoms[atom_id], inventory):
                    mask |= 1 << j
            topology.selector_masks[key] = mask
        work.match_masks.append(mask)
        matching = mask.bit_count()
        if matching < device.count:
            return f"selector: {matching} of {len(ct.atom_ids)} {device.device_class} match"
    return None
