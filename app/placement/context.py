"""What filters and scorers see: :class:`PlanContext` (per ``plan_placement`` call) and
:class:`NodeWork` (per node, filled in as the filters run).

Every filter is ``check(ctx, work) -> str | None`` (a reason rejects the node); every scorer's score
is derived from its declaration (:mod:`app.placement.scorers.contract`). No filter reads what another
wrote: ``classes``, ``match_masks``, ``available_masks`` and ``free_masks`` are filled by the
derivations of :mod:`app.placement.derived` (declared there, run by the registry before the first
reader); ``picks`` and ``atoms`` are the ``picker`` filter's output, read by scorers and the candidate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from itertools import count

from app.placement.model import DeviceRequest, NodeSnapshot, PlacementRequest, PoolSnapshot, Selector
from app.placement.options import SchedulerOptions
from app.placement.plugins import PluginFilter, PluginPicker, PluginScorer
from app.placement.topology import ClassTopology, NodeTopology, Pick, node_topology

_selector_tokens: dict[Selector, int] = {}
_next_token = count(1)  # never reused across cache clears


def selector_token(selector: Selector | None) -> int:
    """A small integer standing for ``selector`` (0 for none), so per-node caches hash an int instead
    of the whole selector."""
    if selector is None or not selector.match_expressions:
        return 0
    token = _selector_tokens.get(selector)
    if token is None:
        if len(_selector_tokens) > 100_000:
            _selector_tokens.clear()
        token = _selector_tokens[selector] = next(_next_token)
    return token


@dataclass(slots=True, eq=False)
class PlanContext:
    """Per-call constants: the request, the pool, options, and what was derived from them once."""

    request: PlacementRequest
    pool: PoolSnapshot
    options: SchedulerOptions
    devices: tuple[DeviceRequest, ...]
    selector_tokens: tuple[int, ...]
    resources: tuple[tuple[str, Decimal], ...]
    node_labels: tuple[tuple[str, str], ...]
    plugin_filters: tuple[tuple[str, PluginFilter], ...]
    plugin_scorers: tuple[tuple[PluginScorer, float], ...]
    pickers: dict[str, tuple[str, PluginPicker]]

    @classmethod
    def build(cls, request: PlacementRequest, pool: PoolSnapshot, options: SchedulerOptions) -> PlanContext:
        plugins = options.plugins
        pickers: dict[str, tuple[str, PluginPicker]] = {}
        for plugin in plugins:
            for picker in plugin.pickers:
                pickers.setdefault(picker.device_class, (plugin.id, picker))
        return cls(
            request=request,
            pool=pool,
            options=options,
            devices=tuple(request.devices),
            selector_tokens=tuple(selector_token(d.selector) for d in request.devices),
            resources=tuple((name, amount_decimal(v)) for name, v in request.resources.items()),
            node_labels=tuple(request.node_labels.items()),
            plugin_filters=tuple((p.id, f) for p in plugins for f in p.filters),
            plugin_scorers=tuple((s, options.weight(s.id, s.weight)) for p in plugins for s in p.scorers),
            pickers=pickers,
        )


def amount_decimal(value: object) -> Decimal:
    """A scalar amount as ``Decimal`` (floats through their text, so 0.29 stays 0.29)."""
    if isinstance(value, Decimal):
        return value
    if isinstance(value, float):
        return Decimal(repr(value))
    return Decimal(str(value))


class NodeWork:
    """One node's scratch state during filtering (one list slot per device request)."""

    __slots__ = (
        "node",
        "topology",
        "classes",
        "match_masks",
        "available_masks",
        "free_masks",
        "picks",
        "atoms",
    )

    def __init__(self, node: NodeSnapshot, n_devices: int) -> None:
        self.node = node
        self.topology: NodeTopology | None = node_topology(node.inventory) if n_devices else None
        # one entry per device request once derived (empty until then, and without devices)
        self.classes: Sequence[ClassTopology | None] = ()
        self.match_masks: Sequence[int] = ()
        self.available_masks: Sequence[int] = ()
        self.free_masks: Sequence[int] = ()
        self.picks: Sequence[Pick | None] = ()
        self.atoms: Sequence[tuple[str, ...]] = ()
