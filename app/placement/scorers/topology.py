"""Scorer ``topology`` (default weight 1.0): link quality of the picked set by its worst link: NV 1,
PIX .8, PXB .6, PHB .4, NODE .2, SYS 0; one atom 1; any unknown link .5 (neutral)."""

from __future__ import annotations

from app.placement.scorers.contract import PICK
from app.placement.topology import LINK_SCORES, ClassTopology, Pick

NAME = "topology"
DEFAULT_WEIGHT = 1.0
DEPENDS = PICK


def share(pick: Pick) -> float:
    """The pick's topology score (:data:`app.placement.topology.LINK_SCORES` of its worst link)."""
    return pick.topology_score


def ceiling(topology: ClassTopology, count: int) -> float:
    """At most the best pair's link score: the worst link of a set is one of its pairs (1 for one atom)."""
    n = len(topology.atom_ids)
    if count <= 1 or n < 2:
        return 1.0
    ranks = topology.ranks
    return max(LINK_SCORES[ranks[i][j]] for i in range(n) for j in range(i + 1, n))
