"""Hard requirement 6 (docs/explain.md): a target is rejected when it "does not permit the requested account,
or its permitted accounts are unknown" (exact match, including case)."""

from __future__ import annotations

from app.fleet.documents import FleetTarget, PlacementRequestDoc
from app.fleet.figures import labels_text
from app.fleet.requirements.context import Context, reason

NAME = "account"
RULE = "does not permit the requested account, or its permitted accounts are unknown"


def check(target: FleetTarget, request: PlacementRequestDoc, ctx: Context) -> list[str]:
    """``request.account`` among ``target.accounts``; unknown (None) accounts reject."""
    if request.account is None:
        return []
    if target.accounts is None:
        return [reason(NAME, f"permitted accounts unknown, want {request.account}")]
    if request.account not in target.accounts:
        return [reason(NAME, f"{request.account} not permitted (permits {labels_text(target.accounts)})")]
    return []
