"""Table and wide output of the operator commands (``node label|taint|cordon ...``, ``quota get|set``;
docs/cli.md): rich renderables built from the service's answers, in the manner of
:mod:`app.client.render` (whose pool and node rows ``pool`` and ``node import`` reuse). Nothing here
talks to the service.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import RenderableType

from app.client.render import (
    EMPTY_CELL,
    NONE,
    field_grid,
    labels_text,
    new_table,
    node_status,
    taints_text,
    when,
)


def operator_labels(node: Mapping[str, Any]) -> dict[str, str]:
    """The node's labels an operator set (``labelSources`` says ``operator``); system labels (from an
    import or an agent's Hello, ``bc.dev/...``) are not the operator's to change."""
    sources = node.get("labelSources") or {}
    return {k: v for k, v in (node.get("labels") or {}).items() if sources.get(k, "operator") == "operator"}


def node_brief_view(node: Mapping[str, Any], wide: bool) -> RenderableType:
    """What a node change prints: name, id, status, cordon, the operator's labels (``wide``: every
    label, with system ones) and the taints."""
    labels = node.get("labels") if wide else operator_labels(node)
    return field_grid(
        [
            ("Name", node["name"]),
            ("ID", node["id"]),
            ("Status", node_status(node)),
            ("Cordoned", "yes" if node.get("cordoned") else "no"),
            ("Labels" if wide else "Operator labels", labels_text(labels, NONE)),
            ("Taints", taints_text(node.get("taints"), NONE)),
        ]
    )


def quota_view(quota: Mapping[str, Any], wide: bool) -> RenderableType:
    """One row per resource with a limit or a use: its limit (``unlimited`` without one), what is held
    now and the peak over the peak window; ``wide`` adds when the peak is first held and the window."""
    limits = quota.get("limits") or {}
    used = quota.get("used") or {}
    peak = quota.get("peak") or {}
    resources = list(dict.fromkeys([*limits, *used, *peak]))
    extra = ["peak at", "peak window"] if wide else []
    table = new_table("resource", "limit", "used", "peak", *extra)
    window = quota.get("peakWindow") or {}
    span = f"{when(window.get('start'))} to {when(window.get('end'))}" if window else EMPTY_CELL
    for name in resources:
        top = peak.get(name) or {}
        row = [
            name,
            str(limits[name]) if name in limits else "unlimited",
            str(used.get(name, 0)),
            str(top.get("used", 0)),
        ]
        if wide:
            row += [when(top.get("at")), span]
        table.add_row(*row)
    if not resources:
        return field_grid([("Quota", f"no limits for tenant {quota.get('tenantId')} (unlimited)")])
    return table
