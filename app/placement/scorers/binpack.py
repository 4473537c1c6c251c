"""Scorer ``binpack`` (default weight 1.0): the share of the node's atoms of the requested class that
are busy after this placement. Counts only (it is part of the shortlist's ranking key)."""

from __future__ import annotations

from app.placement.scorers.contract import COUNTS

NAME = "binpack"
DEFAULT_WEIGHT = 1.0
DEPENDS = COUNTS


def share(total_class_atoms: int, busy_before: int, requested: int) -> float:
    """``(busy_before + requested) / total_class_atoms`` (the contract asks only about a node with atoms
    of the class)."""
    return min(1.0, (busy_before + requested) / total_class_atoms)
