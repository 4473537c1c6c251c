"""Hard requirement 3 (docs/explain.md): a target is rejected when it "lacks the program, or the requested
runtime digest". A requested digest is never substituted by another runtime."""

from __future__ import annotations

from app.fleet.documents import FleetTarget, PlacementRequestDoc
from app.fleet.requirements.context import Context, reason

NAME = "program"
RULE = "lacks the program, or the requested runtime digest"


def check(target: FleetTarget, request: PlacementRequestDoc, ctx: Context) -> list[str]:
    """The program among ``target.programs``, then the requested digest among its runtimes (any one)."""
    digests = target.programs.get(request.program)
    if digests is None:
        return [reason(NAME, f"lacks {request.program}")]
    if request.runtime_digest is not None and request.runtime_digest not in digests:
        return [reason(NAME, f"lacks {request.program} runtime {request.runtime_digest}")]
    return []
