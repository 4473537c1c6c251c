"""Capacity settings: :class:`CapacityConfig` (what the capacity service takes from settings) and the
package's fixed limits (preview candidates, start skew, maximum lead, lifecycle batch size).

Shapes: plain constants (``timedelta`` and ``int``), one frozen dataclass and the plan tokens' keys
(:class:`PlanTokenKeys`, docs/api.md, "Plan tokens"); no I/O. The window rules
these limits serve are on docs/lifecycle.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from app.placement.options import SchedulerOptions

PREVIEW_CANDIDATES = 10
START_SKEW = timedelta(seconds=60)  # a start this far behind the database clock is still "now"
MAX_LEAD = timedelta(days=366)  # BC_CAPACITY_MAX_LEAD: how far ahead a window may start
END_BATCH = 100  # reservations ended per statement of the lifecycle sweep


@dataclass(slots=True)
class PlanTokenKeys:
    """How plan tokens are signed (docs/api.md, "Plan tokens"): ``configured`` is
    ``BC_PLAN_TOKEN_SECRET`` (None: the secret stored in the database, which ``stored`` keeps once read,
    per process); ``ttl`` is ``BC_PLAN_TOKEN_TTL`` in seconds. The one mutable part of the config:
    :mod:`app.capacity.reservations.plan_tokens` fills ``stored``."""

    configured: str | None = field(default=None, repr=False)
    ttl: int = 300
    stored: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class CapacityConfig:
    """What the capacity service needs from settings: scheduler options and ``max_attempts``."""

    options: SchedulerOptions
    max_attempts: int = 3
    shortlist_min: int = 48
    # BC_CAPACITY_ENFORCE_DEVICE_LIMITS: host resources need bc.dev/cap.devices.limits (requiredCapabilities)
    enforce_device_limits: bool = False
    max_lead: timedelta = MAX_LEAD
    # BC_CAPACITY_EARLIEST_PLANS: candidate starts an earliest-start search plans (docs/lifecycle.md)
    earliest_plans: int = 16
    # BC_CAPACITY_BACKFILL_DEPTH: pending reservations per pool given a planned start (docs/lifecycle.md)
    backfill_depth: int = 16
    # BC_CAPACITY_PREEMPTION: a regular request that does not fit may preempt spot work
    preemption: bool = True
    # BC_CAPACITY_PLACER / BC_CAPACITY_MAX_BATCH (docs/placement-rules.md, "Two placers";
    # app/capacity/placing/registry.py)
    placer: str = "inline"
    max_batch: int = 64
    # BC_PLAN_TOKEN_SECRET / BC_PLAN_TOKEN_TTL and the stored secret (docs/api.md, "Plan tokens")
    plan_tokens: PlanTokenKeys = field(default_factory=PlanTokenKeys, compare=False)
