"""Upper bounds on the part of a node's score that is not counts only (docs/placement-rules.md, "The
shortlist").

The shortlist must prove that no node outside it could reach the top N. A node's total is its
count-only part (the ``COUNTS`` scorers, :mod:`app.placement.scorers.contract`) plus the weighted
``PICK`` scores of its pick. Those depend on which atoms are free, but never exceed what the node's
static topology allows; the bound is derived from the scorers' declarations, nothing here names one:

- on hosts of up to 8 or so atoms of the class it is computed exactly: the best weighted sum of the
  ``PICK`` shares over every subset of ``count`` atoms (at most 70 subsets for 8 GPUs);
- on bigger hosts, the sum of each ``PICK`` scorer's declared ``ceiling(topology, count)`` (1.0, the
  most a share can be, when it declares none): for ``topology`` the best pair's link score, for
  ``numa`` 1 / the fewest NUMA groups that can hold ``count`` atoms.

The max of that over a pool's nodes is a valid ceiling for every node outside the shortlist. It depends
only on static inventory, so the I/O half memoizes it per pool inventory version. (``NODE`` scorers
cannot be bounded from inventory: the shortlist does not apply while one is registered.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import combinations
from math import comb

from app.placement.model import DeviceRequest, NodeInventory
from app.placement.scorers import SCORERS
from app.placement.scorers.contract import PICK, Scorer, ScorerSet
from app.placement.topology import node_topology, scored_set

EXACT_SUBSETS = 512  # up to this many subsets the ceiling is the exact best over every subset


def _class_ceiling(
    inventory: NodeInventory, device_class: str, count: int, weighted: tuple[tuple[Scorer, float], ...]
) -> float | None:
    """The most ``sum(w x share(pick))`` over the ``PICK`` scorers a pick of ``count`` atoms of
    ``device_class`` can score on this node, whatever is free; None when the node has fewer atoms than
    ``count``. Exact (the best over every subset) when there are at most ``EXACT_SUBSETS`` subsets, as
    on hosts of up to 8 GPUs; otherwise the sum of the declared ceilings bounds it from above."""
    topo = node_topology(inventory).classes.get(device_class)
    if topo is None or len(topo.atom_ids) < count:
        return None
    n = len(topo.atom_ids)
    if comb(n, count) <= EXACT_SUBSETS:
        return max(
            sum(w * s.share(picked) for s, w in weighted)
            for picked in (scored_set(topo, idx) for idx in combinations(range(n), count))
        )
    return sum(w * (s.ceiling(topo, count) if s.ceiling is not None else 1.0) for s, w in weighted)


def pick_score_ceiling(
    nodes: Iterable[NodeInventory],
    devices: tuple[DeviceRequest, ...],
    weights: Mapping[str, float] | None = None,
    scorers: ScorerSet = SCORERS,
) -> float:
    """The most the ``PICK`` scorers of ``scorers`` (weighted, ``weights`` overriding the defaults by
    id) could add for ``devices`` on any of ``nodes`` (the scorers average over device requests, and
    so does this). Negative weights count as 0. A pool where no node holds the request gives 0."""
    overrides = weights or {}
    weighted = tuple((s, max(0.0, scorers.weight(s, overrides))) for s in scorers.of_kind(PICK))
    most = sum(w for _s, w in weighted)  # every share is at most 1
    if not devices:
        return most
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
            ceiling = _class_ceiling(inventory, d.device_class, d.count, weighted)
            if ceiling is None:
                break
            total += ceiling
        else:
            best = max(best, total / len(devices))
            if best >= most:
                return best  # cannot do better
    return best
