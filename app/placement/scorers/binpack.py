"""Scorer ``binpack`` (default weight 1.0): the share of the node's atoms of the requested class that
are busy after this placement. Counts only (it is part of the shortlist's ranking key)."""

from __future__ import annotations

from app.placement.context import NodeWork, PlanContext

NAME = "binpack"
DEFAULT_WEIGHT = 1.0


def binpack_share(total_class_atoms: int, busy_before: int, requested: int) -> float:
    """``(busy_before + requested) / total_class_atoms`` (0 for a node without atoms of the class)."""
    if total_class_atoms <= 0:
        return 0.0
    return min(1.0, (busy_before + requested) / total_class_atoms)


def score(ctx: PlanContext, work: NodeWork) -> float:
    """Mean over device requests of their class's busy share after placement; 0 without devices."""
    if not ctx.devices:
        return 0.0
    total = 0.0
    for i, device in enumerate(ctx.devices):
        ct = work.classes[i]
        n = len(ct.atom_ids) if ct is not None else 0
        total += binpack_share(n, n - work.available_masks[i].bit_count(), device.count)
    return total / len(ctx.devices)
