"""Quota answers."""

from __future__ import annotations

from pydantic import Field

from app.answers.common import ApiModel, Number, Timestamp


class PeakUse(ApiModel):
    """The most of one resource the tenant holds at any instant of the peak window, and the first
    instant it is held (accounting per instant, docs/quota.md)."""

    used: Number
    at: Timestamp


class PeakWindow(ApiModel):
    """``[start, end)``: now and 7 days ahead."""

    start: Timestamp
    end: Timestamp


class Quota(ApiModel):
    """A tenant's quota in a pool: ``limits`` and ``used`` (held now) by resource (device class or scalar
    name), and ``peak``, the most held at any instant of ``peakWindow``; a resource without a limit is
    unlimited."""

    tenantId: str
    poolId: str
    limits: dict[str, Number]
    used: dict[str, Number] = Field(description="held at this instant")
    peak: dict[str, PeakUse] = Field(description="the most held at any instant of peakWindow")
    peakWindow: PeakWindow


class QuotaWritten(Quota):
    """The answer of a quota write: the quota as written, and ``warnings``: each limit the write dropped
    (a PUT replaces the tenant's limits in the pool, docs/quota.md), and, in a pool without nodes, each
    name that could not be checked against the pool's resources."""

    warnings: list[str]
