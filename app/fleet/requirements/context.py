"""What every hard-requirement check receives: the one signature of :mod:`app.fleet.requirements`.

A check is ``check(target, request, ctx) -> list[str]``: the target's record, the (effective) request
and the :class:`Context` of this explanation; it returns every reason that applies (empty: the target
meets the requirement). Each reason is a whole text ``<NAME>: <detail>`` made with :func:`reason`, so
the prefix is the requirement's name. :func:`missing_labels` is the rule data access and licenses
share; :func:`per_node_shortfall` the one GPUs, scratch and node shape share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from app.fleet.documents import FleetTarget, PlacementRequestDoc
from app.fleet.figures import labels_text


@dataclass(frozen=True)
class Context:
    """``now`` (timezone-aware), ``max_age_seconds`` (``--max-age``) and the target's data age in seconds
    (``now - observed_at``; negative when observed in the future; None when the time is unknown)."""

    now: datetime
    max_age_seconds: int
    age_seconds: float | None


Check = Callable[[FleetTarget, PlacementRequestDoc, Context], list[str]]


def reason(name: str, detail: str) -> str:
    """A reason text: ``"<name>: <detail>"`` (``reason("os", "Darwin, want Linux")``)."""
    return f"{name}: {detail}"


def missing_labels(name: str, needed: list[str] | None, available: list[str] | None) -> list[str]:
    """The reasons of requirement ``name``: ``<name>: unknown, want <needed>`` or
    ``<name>: lacks <missing>`` (in the request's order), or none."""
    if not needed:
        return []
    if available is None:
        return [reason(name, f"unknown, want {labels_text(needed)}")]
    missing = [label for label in needed if label not in available]
    return [reason(name, f"lacks {labels_text(missing)}")] if missing else []


def per_node_shortfall(
    name: str, need: int | None, have: int | None, what: str, unknown: str, unit: str = ""
) -> list[str]:
    """The reasons of requirement ``name`` for a per-node figure a node must reach alone (nodes never
    pool theirs): none when the request asks nothing (``need`` None) or the node's figure ``have`` is at
    least ``need``; ``<name>: needs <need> <what>, <unknown>`` when ``have`` is unknown (None);
    ``<name>: needs <need> <what>, node has <have><unit>`` when it is below (``what``: ``MB per node``,
    ``unit``: ``" MB"``)."""
    if need is None:
        return []
    if have is None:
        return [reason(name, f"needs {need} {what}, {unknown}")]
    if have < need:
        return [reason(name, f"needs {need} {what}, node has {have}{unit}")]
    return []
