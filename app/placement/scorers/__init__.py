"""The scorer registry: ONE ordered tuple (docs/reasons.md). Each entry is a module declaring
``NAME``, ``DEFAULT_WEIGHT``, ``DEPENDS`` and its kind's function (:mod:`app.placement.scorers.contract`);
a node's total is sum(weight x score). Adding a scorer: write its module, add it to ``SCORERS`` below
(docs/extending.md). The default weights, the shortlist's count-only key, the bound on the rest and
the shared-score key are derived from the declarations.

``count_score`` / ``count_score_many`` are the part of the total that depends only on counts (the
``COUNTS`` scorers): the SQL shortlist (``app/placement/shortlist.py``) ranks by them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from app.placement.options import SchedulerOptions
from app.placement.scorers import binpack, numa, spread, topology
from app.placement.scorers.contract import ScorerSet

SCORERS: ScorerSet = ScorerSet.of(binpack, spread, topology, numa)
SCORER_NAMES: tuple[str, ...] = SCORERS.names
DEFAULT_WEIGHTS: Mapping[str, float] = SCORERS.default_weights
_NO_OVERRIDES: Mapping[str, float] = MappingProxyType({})


def scorers_of(options: SchedulerOptions) -> ScorerSet:
    """The scorers a plan uses: ``options.scorers`` when set (tests add toy scorers so), else ``SCORERS``."""
    return options.scorers if options.scorers is not None else SCORERS  # type: ignore[return-value]


def count_score(
    total_class_atoms: int, busy_before: int, requested: int, weights: Mapping[str, float] = _NO_OVERRIDES
) -> float:
    """The count-only part of a node's score for one device request (the registry's ``COUNTS``
    scorers: today ``w_binpack * (busy_before + requested) / total + w_spread * (1 - busy_before /
    total)``). ``weights`` override the declared defaults by scorer id."""
    return SCORERS.count_score_many([(total_class_atoms, busy_before, requested)], weights)


def count_score_many(
    parts: Sequence[tuple[int, int, int]], weights: Mapping[str, float] = _NO_OVERRIDES
) -> float:
    """``count_score`` for several device requests: each ``COUNTS`` scorer's share is the mean over
    ``parts`` of ``(total_class_atoms, busy_before, requested)``, as the pipeline computes it."""
    return SCORERS.count_score_many(parts, weights)
