"""Hard requirement 5 (docs/explain.md): a target is rejected when it "has another architecture, or does not
support the requested ISA level". The architecture an ISA level implies is decided here (docs/explain.md):
``x86-64-*`` is x86_64, ``aarch64*``/``armv8*``/``armv9*`` are aarch64; an unknown target
architecture is not a reason by itself, unknown ISA levels are."""

from __future__ import annotations

from app.fleet.documents import FleetTarget, PlacementRequestDoc
from app.fleet.figures import labels_text
from app.fleet.requirements.context import Context, reason

NAME = "isa"
RULE = "has another architecture, or does not support the requested ISA level"

ISA_ARCH_PREFIXES = (("x86-64", "x86_64"), ("aarch64", "aarch64"), ("armv8", "aarch64"), ("armv9", "aarch64"))
"""ISA level prefix -> the architecture it implies."""
ARCH_ALIASES = {"amd64": "x86_64", "x86_64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}


def isa_arch(isa_level: str) -> str | None:
    """The architecture an ISA level implies (``x86-64-v4`` -> ``x86_64``), or None when unknown."""
    for prefix, arch in ISA_ARCH_PREFIXES:
        if isa_level.startswith(prefix):
            return arch
    return None


def check(target: FleetTarget, request: PlacementRequestDoc, ctx: Context) -> list[str]:
    """The implied architecture against ``target.arch`` (aliases folded), then the level among
    ``target.isa_levels``; both reasons when both fail."""
    if request.isa_level is None:
        return []
    reasons = []
    wanted_arch = isa_arch(request.isa_level)
    if wanted_arch is not None and target.arch is not None:
        if ARCH_ALIASES.get(target.arch, target.arch) != wanted_arch:
            reasons.append(reason(NAME, f"arch {target.arch} cannot run {request.isa_level} ({wanted_arch})"))
    if target.isa_levels is None:
        reasons.append(reason(NAME, f"supported ISA levels unknown, want {request.isa_level}"))
    elif request.isa_level not in target.isa_levels:
        reasons.append(
            reason(NAME, f"{request.isa_level} not supported (supports {labels_text(target.isa_levels)})")
        )
    return reasons
