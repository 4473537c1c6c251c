"""Scorer ``topology`` (default weight 1.0): link quality of the picked set by its worst link: NV 1,
PIX .8, PXB .6, PHB .4, NODE .2, SYS 0; one atom 1; any unknown link .5 (neutral)."""

from __future__ import annotations

from app.placement.context import NodeWork, PlanContext

NAME = "topology"
DEFAULT_WEIGHT = 1.0


def score(ctx: PlanContext, work: NodeWork) -> float:
    """Mean over device requests of their pick's topology score; 1 without devices."""
    picks = work.picks
    if not picks:
        return 1.0
    if len(picks) == 1:
        return picks[0].topology_score  # type: ignore[union-attr]
    return sum(p.topology_score for p in picks if p is not None) / len(picks)
