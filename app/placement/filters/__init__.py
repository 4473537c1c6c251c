"""The filter registry: ONE ordered list (DESIGN.md, "Filters"). A node is rejected by the first filter
that returns a reason. Each entry is a module with ``NAME`` and ``check(ctx, work) -> str | None``."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from app.placement.context import NodeWork, PlanContext
from app.placement.filters import (
    fits,
    labels,
    lease,
    picker,
    plugins,
    scalars,
    schedulable,
    selector,
    topology,
)

FILTERS: tuple[ModuleType, ...] = (
    schedulable,
    labels,
    plugins,
    scalars,
    selector,
    fits,
    topology,
    picker,
    lease,
)
FILTER_NAMES: tuple[str, ...] = tuple(f.NAME for f in FILTERS)
FilterCheck = Callable[[PlanContext, NodeWork], "str | None"]
CHECKS: tuple[FilterCheck, ...] = tuple(f.check for f in FILTERS)
