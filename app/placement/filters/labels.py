"""Filter 2, ``labels``: the request's ``node_labels`` (seed 000, nodeLabels). ``'*'`` asks only that
the label exist; a ``bc.dev/`` label counts only when its source is ``system``.
Reasons: ``labels: missing <key>``, ``labels: <key> is <value>, want <wanted>``."""

from __future__ import annotations

from app.placement.context import NodeWork, PlanContext
from app.placement.system_labels import ANY_LABEL_VALUE, label_counts

NAME = "labels"
READS: tuple[str, ...] = ()
AFTER: tuple[str, ...] = ()


def applies(ctx: PlanContext) -> bool:
    return bool(ctx.node_labels)


def check(ctx: PlanContext, work: NodeWork) -> str | None:
    """The first wanted label (in request order) the node lacks or holds with another value."""
    if not ctx.node_labels:
        return None
    inventory = work.node.inventory
    labels, sources = inventory.labels, inventory.label_sources
    for key, wanted in ctx.node_labels:
        value = labels.get(key)
        if value is not None and not label_counts(key, sources.get(key)):
            value = None
        if value is None:
            return f"labels: missing {key}"
        if wanted != ANY_LABEL_VALUE and value != wanted:
            return f"labels: {key} is {value}, want {wanted}"
    return None
