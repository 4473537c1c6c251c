"""Upper bounds on the pick-dependent part of a node's score (seed 000, "The shortlist").

The shortlist must prove that no node outside it could reach the top N. A node's total is its
count-only part (binpack + spread) plus ``w_topology x topology + w_numa x numa`` of its pick. Those two
depend on which atoms are free, but never exceed what the node's static topology allows:

- on hosts of up to 8 or so atoms of the class it is computed exactly: the best weighted score over
  every subset of ``count`` atoms (at most 70 subsets for 8 GPUs);
- on bigger hosts, ``topology`` is ``LINK_SCORES`` of the picked set's worst link, i.e. the score of one
  of its pairs, so at most the best pair score; ``numa`` is ``1 / spread``, and any ``count`` atoms
  span at least as many NUMA nodes as the fewest groups that can hold them (largest groups first;
  atoms of unknown NUMA form one group).

The max of that over a pool's nodes is a valid ceiling for every node outside the shortlist. It depends
only on static inventory, so the I/O half memoizes it per pool inventory version.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from itertools import combinations
from math import comb

from app.placement.model import DeviceRequest, NodeInventory
from app.placement.options import DEFAULT_WEIGHTS
from app.placement.topology import LINK_SCORES, node_topology, scored_set

EXACT_SUBSETS = 512  # up to this many subsets the ceiling is the exact best over every subset


def _class_ceiling(
    inventory: NodeInventory, device_class: str, count: int, w_topology: float, w_numa: float
) -> float | None:
    """The most ``w_topology x topology + w_numa x numa`` a pick of ``count`` atoms of ``device_class``
    can score on this node, whatever is free; None when the node has fewer atoms than ``count``.

    Exact (the best over every subset) when there are at most ``EXACT_SUBSETS`` subsets, as on hosts of
    up to 8 GPUs; otherwise the best pair score and the fewest NUMA groups bound it from above."""
    topo = node_topology(inventory).classes.get(device_class)
    if topo is None or len(topo.atom_ids) < count:
        return None
    if count <= 1:
        return w_topology + w_numa
    n = len(topo.atom_ids)
    if comb(n, count) <= EXACT_SUBSETS:
        return max(
            w_topology * s.topology_score + w_numa * s.numa_score
            for s in (scored_set(topo, idx) for idx in combinations(range(n), count))
        )
    best_pair = max(LINK_SCORES[topo.ranks[i][j]] for i in range(n) for j in range(i + 1, n))
    groups = sorted(Counter(topo.numa).values(), reverse=True)
    spread, held = 0, 0
    for size in groups:
        spread += 1
        held += size
        if held >= count:
            break
    return w_topology * best_pair + w_numa / spread


def pick_score_ceiling(
    nodes: Iterable[NodeInventory],
    devices: tuple[DeviceRequest, ...],
    weights: Mapping[str, float] | None = None,
) -> float:
    """The most ``w_topology x topology + w_numa x numa`` any of ``nodes`` could score for ``devices``
    (the scorers average over device requests, and so does this). Negative weights count as 0. A pool
    where no node holds the request gives 0."""
    w = dict(DEFAULT_WEIGHTS)
    w.update(weights or {})
    w_topology, w_numa = max(0.0, float(w["topology"])), max(0.0, float(w["numa"]))
    if not devices:
        return w_topology + w_numa
    best = 0.0
    seen: set[tuple[int | None, ...]] = set()  # nodes alike (same class signatures) give the same value
    for inventory in nodes:
        classes = node_topology(inventory).classes
        shape = tuple(
            classes[d.device_class].signature if d.device_class in classes else None for d in devices
        )
        if shape in seen:
            continue
        seen.add(shape)
        total = 0.0
        for d in devices:
            ceiling = _class_ceiling(inventory, d.device_class, d.count, w_topology, w_numa)
            if ceiling is None:
                break
            total += ceiling
        else:
            best = max(best, total / len(devices))
            if best >= w_topology + w_numa:
                return best  # cannot do better
    return best
