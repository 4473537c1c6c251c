"""The pending reason (docs/placement-rules.md, "Reading a pending reason"; docs/reasons.md).

``no node fits (<N> nodes): <count> × <reason>; ...``: identical reasons grouped, most common first,
ties by reason text, at most five groups. An empty pool answers ``the pool has no nodes``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from app.placement.schedulable import POOL_ARCHIVED

EMPTY_POOL = "the pool has no nodes"
# The one pending text of an archived pool (docs/placement-rules.md: "stays pending with the pool is
# archived"), made from the nodes' reason: inline and batch placement, preview and the pipeline all answer
# it.
ARCHIVED_POOL = f"the {POOL_ARCHIVED}"
MAX_GROUPS = 5


def summarize(by_node: Mapping[str, str], node_count: int | None = None) -> str:
    """The pending reason for rejections ``by_node`` (node id -> reason) out of ``node_count`` nodes
    (default: ``len(by_node)``). ``no node fits (3 nodes): 2 × fits: 1 of 4 gpu free; 1 × cordoned``."""
    total = len(by_node) if node_count is None else node_count
    if total == 0:
        return EMPTY_POOL
    groups = sorted(Counter(by_node.values()).items(), key=lambda item: (-item[1], item[0]))
    parts = "; ".join(f"{count} × {reason}" for reason, count in groups[:MAX_GROUPS])
    noun = "node" if total == 1 else "nodes"
    return f"no node fits ({total} {noun}): {parts}"
