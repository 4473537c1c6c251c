"""Scorer ``numa`` (default weight 0.5): 1 / the number of NUMA nodes the picked set spans (atoms with
an unknown NUMA node count as one more node)."""

from __future__ import annotations

from app.placement.context import NodeWork, PlanContext

NAME = "numa"
DEFAULT_WEIGHT = 0.5


def score(ctx: PlanContext, work: NodeWork) -> float:
    """Mean over device requests of 1 / NUMA spread of their pick; 1 without devices."""
    picks = work.picks
    if not picks:
        return 1.0
    if len(picks) == 1:
        return picks[0].numa_score  # type: ignore[union-attr]
    return sum(p.numa_score for p in picks if p is not None) / len(picks)
