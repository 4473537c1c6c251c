"""Health answers."""

from __future__ import annotations

from typing import Literal

from app.answers.common import ApiModel


class Health(ApiModel):
    """``GET /healthz``: the process is up."""

    status: Literal["ok"]


class Readiness(ApiModel):
    """``GET /readyz``: the database answers."""

    status: Literal["ready"]
