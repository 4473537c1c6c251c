"""Scorer ``spread`` (default weight 0.0): 1 - the node's busy share of the requested class before this
placement. Counts only (it is part of the shortlist's ranking key)."""

from __future__ import annotations

from app.placement.context import NodeWork, PlanContext

NAME = "spread"
DEFAULT_WEIGHT = 0.0


def spread_share(total_class_atoms: int, busy_before: int) -> float:
    """``1 - busy_before / total_class_atoms`` (0 for a node without atoms of the class)."""
    if total_class_atoms <= 0:
        return 0.0
    return max(0.0, 1.0 - busy_before / total_class_atoms)


def score(ctx: PlanContext, work: NodeWork) -> float:
    """Mean over device requests of 1 - their class's busy share before placement; 0 without devices."""
    if not ctx.devices:
        return 0.0
    total = 0.0
    for i, _device in enumerate(ctx.devices):
        ct = work.classes[i]
        n = len(ct.atom_ids) if ct is not None else 0
        total += spread_share(n, n - work.available_masks[i].bit_count())
    return total / len(ctx.devices)
