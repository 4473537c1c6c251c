"""The reservation statuses: one home for the API's models and the CLI (kept free of pydantic, so the
CLI starts fast)."""

from __future__ import annotations

from enum import StrEnum


class ReservationStatus(StrEnum):
    """Where a reservation is in its lifecycle (docs/lifecycle.md)."""

    queued = "queued"
    pending = "pending"
    placed = "placed"
    released = "released"
    preempted = "preempted"
    ended = "ended"
