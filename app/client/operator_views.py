"""Table and wide output of the operator commands (``node label|taint|cordon|drain ...``,
``quota get|set``, ``key create|list``; docs/cli.md): rich renderables built from the service's
answers, in the manner of :mod:`app.client.render` (whose pool and node rows ``pool`` and ``node import``
reuse). Nothing here talks to the service; the commands import it when they print a table (rich is
not imported before: docs/cli.md, "Start-up").
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from app.client.render import (
    EMPTY_CELL,
    NONE,
    field_grid,
    labels_text,
    new_table,
    node_name,
    node_status,
    section,
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


def drain_view(node: Mapping[str, Any], names: Mapping[str, str], wide: bool) -> RenderableType:
    """The node's name, id, status and drain; then ``Rescheduled:``, the reservations a reschedule
    moved and the node each went to (by name: ``names`` maps node id -> name), if any."""
    table = new_table("name", "id", "status", "drain", *(["pool"] if wide else []))
    row = [node["name"], node["id"], node_status(node), node.get("drain") or EMPTY_CELL]
    table.add_row(*row, *([node.get("poolId", EMPTY_CELL)] if wide else []))
    moved = node.get("rescheduled") or []
    if not moved:
        return table
    rows = new_table("reservation", "result", "to node", *(["to node id"] if wide else []))
    for m in moved:
        to = m.get("toNodeId")
        cells = [m["reservationId"], m["result"], node_name(names, to) if to else EMPTY_CELL]
        rows.add_row(*cells, *([to or EMPTY_CELL] if wide else []))
    return Group(table, section("Rescheduled", rows))


def key_status(key: Mapping[str, Any], now: datetime) -> str:
    """``revoked``, ``expired`` (its ``expiresAt`` passed by this machine's clock) or ``active``."""
    if key.get("revokedAt"):
        return "revoked"
    if key.get("expiresAt") and datetime.fromisoformat(key["expiresAt"]) <= now:
        return "expired"
    return "active"


def grants_text(grants: list[Mapping[str, str]] | None) -> str:
    """``action on resource, ...``, or ``-``."""
    return ", ".join(f"{g['action']} on {g['resource']}" for g in grants or ()) or EMPTY_CELL


def keys_view(keys: list[Mapping[str, Any]], wide: bool, now: datetime) -> RenderableType:
    """One row per key: id, principal, tenant, status, expiry, last use; ``wide`` adds the creation
    time, the revocation time and the grants."""
    if not keys:
        return Text("no keys")
    extra = ["created", "revoked", "grants"] if wide else []
    table = new_table("id", "principal", "tenant", "status", "expires", "last used", *extra)
    for k in keys:
        row = [k["id"], k["principal"], k.get("tenantId") or EMPTY_CELL, key_status(k, now)]
        row += [when(k.get("expiresAt")), when(k.get("lastUsedAt"))]
        if wide:
            row += [when(k.get("createdAt")), when(k.get("revokedAt")), grants_text(k.get("grants"))]
        table.add_row(*row)
    return table


def created_key_view(key: Mapping[str, Any], wide: bool) -> RenderableType:
    """The new key's row, then its secret on a line of its own (shown this once)."""
    table = new_table("id", "principal", "tenant", "expires")
    table.add_row(key["id"], key["principal"], key.get("tenantId") or EMPTY_CELL, when(key.get("expiresAt")))
    return Group(table, Text(f"key (shown once, store it now): {key['key']}"))
