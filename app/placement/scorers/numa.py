"""Scorer ``numa`` (default weight 0.5): 1 / the number of NUMA nodes the picked set spans (atoms with
an unknown NUMA node count as one more node)."""

from __future__ import annotations

from collections import Counter

from app.placement.scorers.contract import PICK
from app.placement.topology import ClassTopology, Pick

NAME = "numa"
DEFAULT_WEIGHT = 0.5
DEPENDS = PICK


def _spanning(numa_spread: int) -> float:
    """``1 / numa_spread`` (1 for a set that spans none: no atoms)."""
    return 1.0 / numa_spread if numa_spread else 1.0


def share(pick: Pick) -> float:
    """The pick's numa score, ``1 / numa_spread``."""
    return _spanning(pick.numa_spread)


def ceiling(topology: ClassTopology, count: int) -> float:
    """``1 / s`` for the fewest NUMA groups ``s`` that can hold ``count`` atoms (largest groups first;
    atoms of unknown NUMA form one group): no pick spans fewer."""
    spread, held = 0, 0
    for size in sorted(Counter(topology.numa).values(), reverse=True):
        spread += 1
        held += size
        if held >= count:
            break
    return _spanning(spread)
