"""Scheduler options the pipeline takes (docs/placement-rules.md, "Two placers" and "Scorers"): scorer
weights, topN,
plugins, the seed of the random pick among the best topN, and nodes to skip after a lost commit race.

The service builds one from :class:`app.settings.Settings` (``scheduler_weights``, ``scheduler_top_n``,
``scheduler_plugins`` loaded with :func:`app.placement.plugins.load_plugins`); the pipeline never reads
settings itself (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.placement.plugins import SchedulerPlugin
    from app.placement.scorers.contract import ScorerSet

DEFAULT_TOP_N = 5
LOST_RACE_REASON = "excluded after a lost commit race"


@dataclass(frozen=True, slots=True)
class SchedulerOptions:
    """How to rank and pick.

    - ``weights``: scorer id -> weight; overrides the defaults (each built-in scorer's declared
      ``DEFAULT_WEIGHT``, the scorer's own weight for plugin scorers) by id, e.g. ``{"spread": 0.5}``.
    - ``top_n``: the chosen node is a seeded random pick among the best ``top_n`` (>= 1).
    - ``plugins``: :class:`~app.placement.plugins.SchedulerPlugin` objects, in order.
    - ``seed``: seeds ``random.Random`` for that pick; the same seed gives the same plan. Give each
      request its own seed in production so concurrent placements rarely collide on one node.
    - ``excluded_nodes``: node ids to skip (lost a commit race); they are rejected with
      ``exclusion_reasons[id]`` or ``"excluded after a lost commit race"``.
    - ``scorers``: the built-in scorers (a :class:`~app.placement.scorers.contract.ScorerSet`); None is
      the registry ``app.placement.scorers.SCORERS`` (a test passes the registry plus a toy scorer).
    """

    weights: Mapping[str, float] = field(default_factory=dict)
    top_n: int = DEFAULT_TOP_N
    plugins: tuple[SchedulerPlugin, ...] = ()
    seed: int = 0
    excluded_nodes: frozenset[str] = frozenset()
    exclusion_reasons: Mapping[str, str] = field(default_factory=dict)
    scorers: ScorerSet | None = None

    def weight(self, scorer_id: str, default: float) -> float:
        """The weight of ``scorer_id``: the override in ``weights`` if any, else ``default``."""
        return float(self.weights.get(scorer_id, default))
