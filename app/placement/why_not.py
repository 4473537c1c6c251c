"""Why not, exactly: the rejection rows and the nearest misses of a request that fits nowhere
(docs/reasons.md, "Rejection rows" and "Nearest misses"). Pure: snapshot and rejections in, data out.

**Rejection rows.** One row per distinct reason: the filter that gave it, the reason text, how many
nodes it rejected and the names of up to :data:`ROW_NODES` of them (in the pool's node order). Every
node of the snapshot is in exactly one row, so the counts add up to the pool's node count: a node the
shortlist never planned was planned on its exceptions read (docs/placement-rules.md, "The shortlist"),
so it has its own reason like any other. Rows are ordered as the pending summary groups them: most
nodes first, ties by reason text.

**Nearest misses.** Up to :data:`NEAREST` nodes closest to fitting, each with the filter that rejected it,
its reason, and the shortfall in the request's own terms (``3 of 4 gpu free``, ``best NVLink set is 2 of
4``, ``cpu needs 32, 20 free``, ``selector: 2 of 8 gpu match (gpuProduct In [H100])``, ``tainted
dedicated=acme``). Closest means, in this order:

1. the fewest missing atoms: per device request, the count less the atoms of its class that are free for
   the window and match its selector (an ``nvlink-all`` request counts only the largest NVLink-complete
   set among them), summed over the device requests;
2. the fewest scalar resources short, then the smallest shortfall as a share of what is asked, summed;
3. the later filter: a node rejected further down the pipeline passed more of it;
4. the node's name.

The same function answers for a preview, a create left pending and a wake, on every plan path.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal

from app.placement.context import NodeWork, PlanContext
from app.placement.derived import free, matches
from app.placement.filters import EXCLUDED, FILTER_NAMES, fits, scalars, selector, topology
from app.placement.filters.scalars import format_amount, scalar_room
from app.placement.model import NVLINK_ALL, NodeSnapshot, PlacementRequest, PoolSnapshot, Rejections, Selector
from app.placement.options import SchedulerOptions
from app.placement.topology import NV, ClassTopology, node_topology, pick

ROW_NODES = 5  # node names per rejection row
NEAREST = 3  # nearest misses answered
ADMIT = "admit"  # the filter name of a plugin admit hook's refusal (no node was planned)
_ORDER = {name: i for i, name in enumerate((EXCLUDED, *FILTER_NAMES))}


@dataclass(frozen=True, slots=True)
class RejectionRow:
    """``count`` nodes rejected by ``filter`` with ``reason``; ``nodes``: up to 5 of their names."""

    filter: str
    reason: str
    count: int
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NearMiss:
    """A node close to fitting: the filter and reason that rejected it, the ``shortfall`` in the
    request's terms and how many atoms it misses (``missing_atoms``)."""

    node_id: str
    node_name: str
    filter: str
    reason: str
    shortfall: str
    missing_atoms: int


@dataclass(frozen=True, slots=True)
class WhyNot:
    """The rejection rows (counts summing to the pool's node count) and the nearest misses."""

    rows: tuple[RejectionRow, ...]
    nearest: tuple[NearMiss, ...]


def why_not(
    request: PlacementRequest, snapshot: PoolSnapshot, rejections: Rejections, options: SchedulerOptions
) -> WhyNot:
    """The rows and nearest misses of ``rejections``, a plan of ``request`` on ``snapshot`` that found
    nothing (module docstring)."""
    nodes = snapshot.nodes
    if not nodes:
        return WhyNot((), ())
    if not rejections.by_node:  # a plugin admit hook refused the request before any node was planned
        names = tuple(n.inventory.name for n in nodes[:ROW_NODES])
        return WhyNot((RejectionRow(ADMIT, rejections.summary, len(nodes), names),), ())
    return WhyNot(_rows(nodes, rejections), _nearest(request, snapshot, rejections, options))


def _rows(nodes: tuple[NodeSnapshot, ...], rejections: Rejections) -> tuple[RejectionRow, ...]:
    by_node, filters = rejections.by_node, rejections.filters
    counts: Counter[tuple[str, str]] = Counter()
    names: dict[tuple[str, str], list[str]] = {}
    for node in nodes:
        reason = by_node.get(node.id)
        if reason is None:  # not expected: every node of a plan that found nothing has a reason
            continue
        key = (reason, filters.get(node.id, ""))
        counts[key] += 1
        listed = names.setdefault(key, [])
        if len(listed) < ROW_NODES:
            listed.append(node.inventory.name)
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0][0], item[0][1]))
    return tuple(RejectionRow(flt, reason, n, tuple(names[(reason, flt)])) for (reason, flt), n in ordered)


def _nearest(
    request: PlacementRequest, snapshot: PoolSnapshot, rejections: Rejections, options: SchedulerOptions
) -> tuple[NearMiss, ...]:
    ctx = PlanContext.build(request, snapshot, options)
    wanted = [(name, amount) for name, amount in ctx.resources if amount > 0]
    # a device request whose usable atoms need the masks: a selector, or an nvlink-all set to measure
    masked = any(ctx.selector_tokens) or any(d.topology == NVLINK_ALL and d.count > 1 for d in ctx.devices)
    by_node, filters = rejections.by_node, rejections.filters
    keyed: list[tuple[tuple[int, int, float, int, str], int]] = []
    for i, node in enumerate(snapshot.nodes):
        if node.id not in by_node:
            continue
        if masked:
            work = _derived(ctx, node)
            missing = sum(_missing(ctx, work, d) for d in range(len(ctx.devices)))
        else:
            missing = _missing_by_count(ctx, node)
        short, share = 0, 0.0
        for name, amount in wanted:
            room = scalar_room(node.state.resources.get(name))
            if amount > room:
                short += 1
                share += float((amount - room) / amount)
        later = -_ORDER.get(filters.get(node.id, ""), -1)
        keyed.append(((missing, short, share, later, node.inventory.name), i))
    nearest = heapq.nsmallest(NEAREST, keyed)  # the key's last part, the name, is unique in a pool
    nodes = snapshot.nodes
    return tuple(_miss(ctx, rejections, nodes[i], _derived(ctx, nodes[i]), key[0]) for key, i in nearest)


def _derived(ctx: PlanContext, node: NodeSnapshot) -> NodeWork:
    """The node's work with its class topologies and free, matching masks derived."""
    work = NodeWork(node, len(ctx.devices))
    if ctx.devices and work.topology is not None:
        matches(ctx, work)
        free(ctx, work)
    return work


def _missing_by_count(ctx: PlanContext, node: NodeSnapshot) -> int:
    """:func:`_missing` summed over device requests without a selector or an NVLink set: counts only."""
    if not ctx.devices:
        return 0
    topology = node_topology(node.inventory)
    booked, unavailable = node.state.booked, node.state.unavailable
    missing = 0
    for device in ctx.devices:
        ct = topology.classes.get(device.device_class)
        if ct is None:
            missing += device.count
            continue
        index = ct.index
        taken = sum(1 for a in booked if a in index) + sum(
            1 for a in unavailable if a in index and a not in booked
        )
        missing += max(device.count - (len(ct.atom_ids) - taken), 0)
    return missing


def _missing(ctx: PlanContext, work: NodeWork, i: int) -> int:
    """How many atoms device request ``i`` misses on the node (module docstring, 1)."""
    device = ctx.devices[i]
    if not work.classes or work.classes[i] is None:
        return device.count
    ct = work.classes[i]
    assert ct is not None
    usable = work.free_masks[i].bit_count()
    if device.topology == NVLINK_ALL and device.count > 1 and usable >= 2:
        usable = _best_nvlink_set(ct, work.free_masks[i], min(usable, device.count))
    return max(device.count - usable, 0)


def _best_nvlink_set(ct: ClassTopology, mask: int, most: int) -> int:
    """The size of the largest NVLink-complete set (up to ``most``) among the atoms of ``mask``."""
    for size in range(most, 1, -1):
        if pick(ct, mask, size).worst_link == NV:
            return size
    return 1


def _miss(
    ctx: PlanContext, rejections: Rejections, node: NodeSnapshot, work: NodeWork, missing: int
) -> NearMiss:
    flt = rejections.filters.get(node.id, "")
    reason = rejections.by_node[node.id]
    return NearMiss(
        node.id, node.inventory.name, flt, reason, _shortfall(ctx, node, work, flt, reason), missing
    )


def _shortfall(ctx: PlanContext, node: NodeSnapshot, work: NodeWork, flt: str, reason: str) -> str:
    """The shortfall in the request's terms (module docstring); the reason itself where it already is."""
    if flt in (fits.NAME, topology.NAME) and work.classes:
        for i, device in enumerate(ctx.devices):
            ct = work.classes[i]
            usable = work.free_masks[i].bit_count() if ct is not None else 0
            if usable < device.count:
                return f"{usable} of {device.count} {device.device_class} free"
            if device.topology == NVLINK_ALL and device.count > 1 and ct is not None:
                best = _best_nvlink_set(ct, work.free_masks[i], device.count)
                if best < device.count:
                    return f"best NVLink set is {best} of {device.count}"
    if flt == scalars.NAME:
        return reason.removeprefix(f"{scalars.NAME}: ")
    if flt == selector.NAME:
        for device in ctx.devices:
            if device.selector is not None and device.selector.match_expressions:
                return f"{reason} ({selector_text(device.selector)})"
    return reason


def selector_text(chosen: Selector) -> str:
    """``gpuProduct In [H100], memoryMiB Gt 40000``: a selector as its matchExpressions read."""
    parts = []
    for e in chosen.match_expressions:
        values = ", ".join(format_amount(v) if isinstance(v, Decimal) else v for v in e.values)
        parts.append(f"{e.key} {e.op} [{values}]" if e.values else f"{e.key} {e.op}")
    return ", ".join(parts)
