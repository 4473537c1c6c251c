"""Hard requirement 9 (docs/explain.md): a target is rejected when it "lacks any required license-eligibility
label, or its license eligibility is unknown"."""

from __future__ import annotations

from app.fleet.documents import FleetTarget, PlacementRequestDoc
from app.fleet.requirements.context import Context, missing_labels

NAME = "licenses"
RULE = "lacks any required license-eligibility label, or its license eligibility is unknown"


def check(target: FleetTarget, request: PlacementRequestDoc, ctx: Context) -> list[str]:
    """Every ``request.required_licenses`` label in ``target.licenses``."""
    return missing_labels(NAME, request.required_licenses, target.licenses)
