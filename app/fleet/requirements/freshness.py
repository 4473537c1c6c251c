"""Hard requirement 2 (docs/explain.md): a target is rejected when it "was observed longer ago than --max-age
(default 300 s), or more than 60 s in the future (clock skew)". Equality with the max age fits; an
unknown observation time rejects."""

from __future__ import annotations

from app.fleet.documents import FleetTarget, PlacementRequestDoc
from app.fleet.figures import num_text
from app.fleet.requirements.context import Context, reason

NAME = "freshness"
RULE = "was observed longer ago than --max-age (default 300 s), or more than 60 s in the future (clock skew)"
DEFAULT_MAX_AGE_SECONDS = 300
CLOCK_SKEW_SECONDS = 60


def check(target: FleetTarget, request: PlacementRequestDoc, ctx: Context) -> list[str]:
    """The data age (``ctx.age_seconds``) against ``ctx.max_age_seconds`` and the 60 s skew allowance."""
    age = ctx.age_seconds
    if age is None:
        return [reason(NAME, "observation time unknown")]
    if age > ctx.max_age_seconds:
        return [
            reason(NAME, f"observed {num_text(age)} s ago, older than the max age of {ctx.max_age_seconds} s")
        ]
    if -age > CLOCK_SKEW_SECONDS:
        return [
            reason(
                NAME,
                f"observed {num_text(-age)} s in the future, "
                f"beyond the {CLOCK_SKEW_SECONDS} s clock-skew allowance",
            )
        ]
    return []
