"""The runtime listing of a deployment root (``vq runtime-bundle generations --root ROOT --json``) and
its overlay on a daemon target's programs (docs/explain.md).

``docs/fleet.md`` defines the listing as ``vq.runtime-generations/1``::

    {"schema_name": "vq.runtime-generations/1", "root": "/opt/portable-runtimes/vibe-qc",
     "programs": {"vibe-qc": {"current": "<artifact id>",
                              "generations": [{"id": "<artifact id>", "verified": true}, ...]}}}

Pure: listing in, programs out.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StringConstraints

from app.errors import InvalidInput
from app.fleet.documents import DIGEST_PATTERN, LABEL_PATTERN, MAX_LABELS, validated

RUNTIME_LISTING_SCHEMA = "vq.runtime-generations/1"

Text = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=4096)]


class Generation(BaseModel):
    """One deployed generation: its artifact ``id`` (the runtime digest) and whether it was verified."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Text
    verified: StrictBool


class ProgramGenerations(BaseModel):
    """A program's generations and the root's ``current`` selection (``None`` when none is selected)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    current: Text | None = None
    generations: list[Generation] = Field(max_length=100_000)


class RuntimeListing(BaseModel):
    """``vq.runtime-generations/1``: the deployment ``root`` (absolute path) and per program its
    generations."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_name: Literal["vq.runtime-generations/1"]
    root: Text
    programs: dict[Text, ProgramGenerations] = Field(max_length=4096)


def load_runtime_listing(data: Any) -> RuntimeListing:
    """Validate a parsed listing; raises :class:`InvalidInput` naming the field."""
    if not isinstance(data, dict) or data.get("schema_name") != RUNTIME_LISTING_SCHEMA:
        raise InvalidInput(
            f"runtime listing: schema_name: want {RUNTIME_LISTING_SCHEMA!r}", path="schema_name"
        )
    return validated(RuntimeListing, data, "runtime listing")


def generations_command(root: str) -> list[str]:
    """The argv run on the daemon host: ``vq runtime-bundle generations --root ROOT --json``."""
    return ["vq", "runtime-bundle", "generations", "--root", root, "--json"]


def overlay_runtimes(
    programs: dict[str, list[str]], listing: RuntimeListing
) -> tuple[dict[str, list[str]], list[str]]:
    """The target's new ``programs`` and what was skipped (one text each).

    For each program with verified generations, its list becomes those generations' ids: the root's
    ``current`` first when it is one of them, then the rest in identity (id) order, at most 256. Skipped:
    unverified generations, ids a placement record cannot hold as a digest, and programs whose name is
    not a placement label. A program the listing does not mention keeps its base list.
    """
    result = {name: list(digests) for name, digests in programs.items()}
    skipped: list[str] = []
    for name in sorted(listing.programs):
        entry = listing.programs[name]
        if not re.match(LABEL_PATTERN, name):
            skipped.append(f"program {name!r}: not a placement program name")
            continue
        verified: set[str] = set()
        unverified = 0
        for generation in entry.generations:
            if not generation.verified:
                unverified += 1
            elif not re.match(DIGEST_PATTERN, generation.id):
                skipped.append(f"program {name}: generation {generation.id!r} is not a runtime digest")
            else:
                verified.add(generation.id)
        if unverified:
            skipped.append(f"program {name}: {unverified} unverified generation(s) not counted")
        if not verified:
            skipped.append(f"program {name}: no verified generation, base record kept")
            continue
        ordered = sorted(verified)
        if entry.current in verified:
            ordered.remove(entry.current)
            ordered.insert(0, entry.current)
        if len(ordered) > MAX_LABELS:
            skipped.append(f"program {name}: {len(ordered) - MAX_LABELS} generation(s) beyond {MAX_LABELS}")
            ordered = ordered[:MAX_LABELS]
        result[name] = ordered
    return result, skipped
