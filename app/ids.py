"""Prefixed ULID ids (DESIGN.md, "Capacity model"): ``pool_01k...``, ``node_01k...``, ``res_01k...``."""

from __future__ import annotations

from ulid import ULID


def new_id(prefix: str) -> str:
    """``<prefix>_<lower-case ULID>``, e.g. ``new_id("res")`` -> ``res_01kb...``; sortable by time."""
    return f"{prefix}_{str(ULID()).lower()}"
