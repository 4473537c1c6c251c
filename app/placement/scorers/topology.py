"""Scorer ``topology`` (default weight 1.0): link quality of the picked set by its worst link: NV 1,
PIX .8, PXB .6, PHB .4, NODE .2, SYS 0; one atom 1; any unknown link .5 (neutral)."""

from __future__ import annotations

from app.placement.scorers.contract import PICK
from app.placement.topology import NODE, NV, PHB, PIX, PXB, SYS, UNKNOWN, ClassTopology, Pick

NAME = "topology"
DEFAULT_WEIGHT = 1.0
DEPENDS = PICK

# docs/reasons.md: the score of a link rank (app.placement.topology ranks them)
LINK_SCORES = {NV: 1.0, PIX: 0.8, PXB: 0.6, PHB: 0.4, NODE: 0.2, SYS: 0.0, UNKNOWN: 0.5}


def share(pick: Pick) -> float:
    """:data:`LINK_SCORES` of the pick's worst link (1 for fewer than two atoms)."""
    return 1.0 if len(pick.indices) <= 1 else LINK_SCORES[pick.worst_link]


def ceiling(topology: ClassTopology, count: int) -> float:
    """At most the best pair's link score: the worst link of a set is one of its pairs (1 for one atom)."""
    n = len(topology.atom_ids)
    if count <= 1 or n < 2:
        return 1.0
    ranks = topology.ranks
    return max(LINK_SCORES[ranks[i][j]] for i in range(n) for j in range(i + 1, n))
