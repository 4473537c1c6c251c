"""The scorer registry: ONE ordered list (DESIGN.md, "Scorers"). Each entry is a module with ``NAME``,
``DEFAULT_WEIGHT`` and ``score(ctx, work) -> float`` in 0..1; a node's total is sum(weight x score).

``count_score`` is the part of the total that depends only on counts (binpack + spread): the SQL
shortlist (``app/capacity``) ranks by the same formula, so it must mirror this function exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import ModuleType

from app.placement.options import DEFAULT_WEIGHTS
from app.placement.scorers import binpack, numa, spread, topology
from app.placement.scorers.binpack import binpack_share
from app.placement.scorers.spread import spread_share

SCORERS: tuple[ModuleType, ...] = (binpack, spread, topology, numa)
SCORER_NAMES: tuple[str, ...] = tuple(s.NAME for s in SCORERS)


def count_score(
    total_class_atoms: int, busy_before: int, requested: int, weights: Mapping[str, float] = DEFAULT_WEIGHTS
) -> float:
    """The count-only part of a node's score for one device request:
    ``w_binpack * (busy_before + requested) / total + w_spread * (1 - busy_before / total)``.

    ``total_class_atoms``: the node's atoms of the requested class (all of them, selector aside);
    ``busy_before``: those not free for the window (booked, unhealthy or unbookable); ``requested``:
    the count. ``weights`` are scorer id -> weight, missing ids take ``DEFAULT_WEIGHTS``."""
    return count_score_many([(total_class_atoms, busy_before, requested)], weights)


def count_score_many(
    parts: Sequence[tuple[int, int, int]], weights: Mapping[str, float] = DEFAULT_WEIGHTS
) -> float:
    """``count_score`` for several device requests: binpack and spread are each the mean over
    ``parts`` of ``(total_class_atoms, busy_before, requested)``, as the pipeline computes them."""
    w_binpack = float(weights.get("binpack", DEFAULT_WEIGHTS["binpack"]))
    w_spread = float(weights.get("spread", DEFAULT_WEIGHTS["spread"]))
    if not parts:
        return 0.0
    b = sum(binpack_share(t, busy, r) for t, busy, r in parts) / len(parts)
    s = sum(spread_share(t, busy) for t, busy, _r in parts) / len(parts)
    return w_binpack * b + w_spread * s
