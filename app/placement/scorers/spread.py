"""Scorer ``spread`` (default weight 0.0): 1 - the node's busy share of the requested class before this
placement. Counts only (it is part of the shortlist's ranking key)."""

from __future__ import annotations

from app.placement.scorers.contract import COUNTS

NAME = "spread"
DEFAULT_WEIGHT = 0.0
DEPENDS = COUNTS


def share(total_class_atoms: int, busy_before: int, requested: int) -> float:
    """``1 - busy_before / total_class_atoms`` (the contract asks only about a node with atoms of the
    class)."""
    return max(0.0, 1.0 - busy_before / total_class_atoms)
