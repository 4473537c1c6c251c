"""Scheduler plugins (docs/placement-rules.md, "Scorers" and "Atom pick and NVLink"): extra filters, extra
scorers,
per-class atom pickers (``preferAllocation``) and an admit hook, loaded from settings by import path.

A plugin filter is ``(request, node) -> True | {"reason": str}`` (``None``/``True`` pass; a mapping or an
object with ``reason``, a string or ``False`` reject) and is reported as ``<plugin-id>/<filter-id>:
<reason>``. A scorer ``(request, node) -> float`` is clamped to 0..1 and weighted by its own weight
(1 by default) unless the scheduler weights override its id. A picker for a device class,
``preferAllocation(request, device_request, node, free_candidates) -> list[atom id]``, wins over the
default pick and must return exactly ``count`` distinct free candidates. ``admit(request)`` returns
``None`` to admit or a reason to refuse.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.placement.model import DeviceRequest, NodeSnapshot, PlacementRequest

FilterFn = Callable[[PlacementRequest, NodeSnapshot], Any]
ScoreFn = Callable[[PlacementRequest, NodeSnapshot], float]
PreferAllocationFn = Callable[[PlacementRequest, DeviceRequest, NodeSnapshot, Sequence[str]], Sequence[str]]
AdmitFn = Callable[[PlacementRequest], "str | None"]


@dataclass(frozen=True, slots=True)
class PluginFilter:
    """``id`` and ``filter(request, node) -> True | {"reason": str}``."""

    id: str
    filter: FilterFn


@dataclass(frozen=True, slots=True)
class PluginScorer:
    """``id``, ``weight`` (default 1) and ``score(request, node) -> float`` (clamped to 0..1)."""

    id: str
    score: ScoreFn
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class PluginPicker:
    """``preferAllocation`` for atoms of ``device_class``."""

    device_class: str
    prefer_allocation: PreferAllocationFn


@dataclass(frozen=True, slots=True)
class SchedulerPlugin:
    """A named bundle of filters, scorers, pickers and an optional admit hook."""

    id: str
    filters: tuple[PluginFilter, ...] = ()
    scorers: tuple[PluginScorer, ...] = ()
    pickers: tuple[PluginPicker, ...] = ()
    admit: AdmitFn | None = None


def _get(spec: Any, *names: str) -> Any:
    for name in names:
        if isinstance(spec, Mapping) and name in spec:
            return spec[name]
        if not isinstance(spec, Mapping) and hasattr(spec, name):
            return getattr(spec, name)
    raise ValueError(f"plugin part {spec!r} lacks {names[0]!r}")


def _as_filter(spec: Any) -> PluginFilter:
    if isinstance(spec, PluginFilter):
        return spec
    return PluginFilter(str(_get(spec, "id")), _get(spec, "filter"))


def _as_scorer(spec: Any) -> PluginScorer:
    if isinstance(spec, PluginScorer):
        return spec
    weight = spec.get("weight", 1.0) if isinstance(spec, Mapping) else getattr(spec, "weight", 1.0)
    return PluginScorer(str(_get(spec, "id")), _get(spec, "score"), float(weight))


def _as_picker(spec: Any) -> PluginPicker:
    if isinstance(spec, PluginPicker):
        return spec
    device_class = _get(spec, "device_class", "deviceClass", "class")
    return PluginPicker(str(device_class), _get(spec, "prefer_allocation", "preferAllocation"))


def define_scheduler_plugin(
    id: str,
    filters: Iterable[Any] = (),
    scorers: Iterable[Any] = (),
    pickers: Iterable[Any] = (),
    admit: AdmitFn | None = None,
) -> SchedulerPlugin:
    """Build a :class:`SchedulerPlugin` (docs/placement-rules.md's ``defineSchedulerPlugin``).

    Parts may be the dataclasses above or mappings in the seed's shape: filters ``{"id", "filter"}``,
    scorers ``{"id", "weight"?, "score"}``, pickers ``{"deviceClass", "preferAllocation"}``. Raises
    ``ValueError`` for an empty id, a missing part, or two filters / scorers with one id.
    """
    if not id:
        raise ValueError("a scheduler plugin needs an id")
    plugin = SchedulerPlugin(
        id=id,
        filters=tuple(_as_filter(f) for f in filters),
        scorers=tuple(_as_scorer(s) for s in scorers),
        pickers=tuple(_as_picker(p) for p in pickers),
        admit=admit,
    )
    for kind, ids in (("filter", [f.id for f in plugin.filters]), ("scorer", [s.id for s in plugin.scorers])):
        if len(set(ids)) != len(ids):
            raise ValueError(f"plugin {id!r} defines one {kind} id twice")
    return plugin


def load_plugins(import_paths: Sequence[str]) -> tuple[SchedulerPlugin, ...]:
    """Import each ``module:attribute`` path (settings ``scheduler_plugins``) and return the plugins in
    order. The attribute may be a :class:`SchedulerPlugin` or a list/tuple of them. Raises
    ``ValueError`` naming the path when it is malformed, missing, or not a plugin."""
    plugins: list[SchedulerPlugin] = []
    for path in import_paths:
        module_name, sep, attribute = path.partition(":")
        if not sep or not module_name or not attribute:
            raise ValueError(f"scheduler plugin path {path!r} is not 'module:attribute'")
        try:
            target: Any = importlib.import_module(module_name)
            for part in attribute.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot load scheduler plugin {path!r}: {exc}") from exc
        found = list(target) if isinstance(target, (list, tuple)) else [target]
        for plugin in found:
            if not isinstance(plugin, SchedulerPlugin):
                raise ValueError(f"{path!r} is not a SchedulerPlugin (use define_scheduler_plugin)")
            plugins.append(plugin)
    return tuple(plugins)


def filter_rejection(result: Any) -> str | None:
    """A plugin filter's answer as a reason, or ``None`` when it passes (``True``/``None``)."""
    if result is True or result is None:
        return None
    if result is False:
        return "rejected"
    if isinstance(result, str):
        return result
    if isinstance(result, Mapping):
        return str(result.get("reason") or "rejected")
    reason = getattr(result, "reason", None)
    return str(reason) if reason else "rejected"


def admission_refusal(plugins: Sequence[SchedulerPlugin], request: PlacementRequest) -> str | None:
    """The first admit hook's refusal as ``admit <plugin-id>: <reason>``, or ``None`` when all admit."""
    for plugin in plugins:
        if plugin.admit is None:
            continue
        reason = plugin.admit(request)
        if reason:
            return f"admit {plugin.id}: {reason}"
    return None


def clamp_score(value: Any) -> float:
    """A plugin score clamped to 0..1; NaN and non-numbers score 0."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    if number != number:
        return 0.0
    return min(1.0, max(0.0, number))
