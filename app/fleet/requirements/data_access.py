"""Hard requirement 8 (docs/explain.md): a target is rejected when it "lacks any required data-access
label, or
its data access is unknown"."""

from __future__ import annotations

from app.fleet.documents import FleetTarget, PlacementRequestDoc
from app.fleet.requirements.context import Context, missing_labels

NAME = "data_access"
RULE = "lacks any required data-access label, or its data access is unknown"


def check(target: FleetTarget, request: PlacementRequestDoc, ctx: Context) -> list[str]:
    """Every ``request.required_data_access`` label in ``target.data_access``."""
    return missing_labels(NAME, request.required_data_access, target.data_access)
