"""A scheduler plugin loaded by import path in tests (docs/placement-rules.md's rack-affinity example)."""

from __future__ import annotations

from typing import Any

from app.placement.plugins import define_scheduler_plugin


def _no_quarantine(request: Any, node: Any) -> Any:
    return {"reason": "rack r13 is quarantined"} if node.inventory.labels.get("rack") == "r13" else True


def _rack_a(request: Any, node: Any) -> float:
    return 1.0 if node.inventory.labels.get("rack", "").startswith("a") else 0.0


rack_affinity = define_scheduler_plugin(
    "rack-affinity",
    filters=[{"id": "no-quarantine-rack", "filter": _no_quarantine}],
    scorers=[{"id": "rack-a", "weight": 0.5, "score": _rack_a}],
)


def _explode(request: Any, node: Any) -> Any:
    if node.inventory.labels.get("explode") == "yes":
        raise RuntimeError("a plugin bug: an unexpected error (tests: it is logged once)")
    return True


# a plugin with a bug: its filter raises on nodes labelled explode=yes (the service answers 500)
exploding = define_scheduler_plugin("exploding", filters=[{"id": "explode", "filter": _explode}])
