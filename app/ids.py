"""Prefixed ULID ids (docs/architecture.md): ``pool_01k...``, ``node_01k...``, ``res_01k...``;
and the one rule for a tenant id, which callers choose (:data:`TenantId`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from ulid import ULID

TENANT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
TenantId = Annotated[str, Field(min_length=1, max_length=128, pattern=TENANT_ID_PATTERN)]
"""A tenant id: 1..128 letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit
(``acme``, ``team-7.gpu``). The one rule for a reservation's, a quota's and an API key's tenant."""


def new_id(prefix: str) -> str:
    """``<prefix>_<lower-case ULID>``, e.g. ``new_id("res")`` -> ``res_01kb...``; sortable by time."""
    return f"{prefix}_{str(ULID()).lower()}"
