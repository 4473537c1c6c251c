"""Filter 2, ``labels``: the request's ``node_labels`` (docs/placement-rules.md, nodeLabels), by the one
labels rule
(:func:`app.placement.system_labels.unmet_label`): ``'*'`` asks only that the label exist; a ``bc.dev/``
label counts only when its source is ``system``.
Reasons: ``labels: missing <key>``, ``labels: <key> is <value>, want <wanted>``."""

from __future__ import annotations

from app.placement.context import NodeWork, PlanContext
from app.placement.system_labels import unmet_label

NAME = "labels"
# what it reads of the request and the node (docs/extending.md, "What a filter reads")
REQUEST_READS: tuple[str, ...] = ("node_labels",)
NODE_READS: tuple[str, ...] = ("inventory.labels", "inventory.label_sources")
READS: tuple[str, ...] = ()
AFTER: tuple[str, ...] = ()


def applies(ctx: PlanContext) -> bool:
    return bool(ctx.node_labels)


def check(ctx: PlanContext, work: NodeWork) -> str | None:
    """The first wanted label (in request order) the node lacks or holds with another value."""
    if not ctx.node_labels:
        return None
    inventory = work.node.inventory
    unmet = unmet_label(ctx.node_labels, inventory.labels, inventory.label_sources)
    return None if unmet is None else f"labels: {unmet}"
