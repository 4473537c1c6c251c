"""Intake check: could the pool, as its nodes are built now, ever hold a request (docs/api.md, "Checked
at intake")? Pure: it reads the static part of the pool only (node inventories and the scalar capacity
``floor(allocatable x ratio)`` of each node) and never bookings, health, cordons, taints, dedications or
operator labels, which can all change while a request waits.

Three outcomes, checked in this order:

1. ``invalid``: a device class or scalar resource that no node of the pool has, as ``(path, message)``
   with ``path`` ``devices.<i>.class`` or ``resources.<name>`` (INVALID_INPUT);
2. ``unsatisfiable``: no node could hold one copy of the request even if the pool were empty, healthy
   and uncordoned, or, for a gang, no ``members`` such nodes share one ``topologyKey`` value. The text
   names the largest shape the pool has (``no node of pool gpu-hosts can hold 100 gpu: the largest has
   8``) (UNSATISFIABLE);
3. ``warnings``: a selector key that no device attribute and no node label of the pool carries.

A node's static capacity for one copy: for each device request, its atoms of the class whose device
attributes do not contradict the selector (an expression on a key the atom has no attribute for reads
a node label, which may change, so it is not held against the atom); for ``nvlink-all`` the largest
NVLink-complete set of those atoms; the device requests of one class together need that many atoms of
the class; each scalar amount at most the node's capacity. These are necessary conditions only, so a
refused request can never be placed, while an accepted one may still wait (``pending``).

An empty pool is not judged (it stays ``pending`` with ``the pool has no nodes``): nodes may be added
later. The verdict is about the pool as it is now; a node added later is judged by later requests.

Cost: nodes are grouped by their static shape once per inventory version (the ``memo`` the caller keeps
with the inventory), so a request costs a pass over the distinct shapes, not over the nodes (a gang
with a ``topologyKey`` also counts the domains of the shapes that fit, memoized per key).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from app.placement.filters.scalars import format_amount
from app.placement.model import (
    NVLINK_ALL,
    Atom,
    DeviceRequest,
    MatchExpression,
    NodeInventory,
    PlacementRequest,
)
from app.placement.selectors import expression_holds
from app.placement.topology import NV, ClassTopology, node_topology

MAX_CLIQUE_ATOMS = 64  # a class larger than this on one node is not searched for NVLink cliques


@dataclass(frozen=True, slots=True)
class IntakeVerdict:
    """What intake says about a request: ``invalid`` ``(path, message)``, ``unsatisfiable`` (message),
    ``warnings`` (messages). All empty: nothing to say (the request goes on to be placed)."""

    invalid: tuple[str, str] | None = None
    unsatisfiable: str | None = None
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeShape:
    """The static shape shared by some nodes of a pool: a representative inventory, its scalar
    capacities (resource -> ``floor(allocatable x ratio)``) and the labels of each node of this shape
    (a gang's ``topologyKey`` domains are read from them)."""

    inventory: NodeInventory
    capacities: Mapping[str, Decimal]
    node_labels: tuple[Mapping[str, str], ...]


@dataclass(frozen=True, slots=True)
class PoolShapes:
    """A pool's nodes grouped by static shape, with what the pool has: device classes, scalar
    resources, and the keys a selector can read (device attributes and node labels)."""

    shapes: tuple[NodeShape, ...]
    device_classes: frozenset[str]
    resources: frozenset[str]
    selector_keys: frozenset[str]


def _shape_key(
    node: NodeInventory, capacities: Mapping[str, Decimal], texts: dict[int, str]
) -> tuple[Any, ...]:
    # Each distinct attributes mapping is written out once (``texts``, by identity: the I/O half shares
    # one mapping between atoms whose stored attributes are the same text), so two nodes of one model
    # share a key. The class topology signature covers links and NUMA nodes.
    topo = node_topology(node)
    by_id = {a.id: a for a in node.atoms}
    classes = []
    for name, ct in sorted(topo.classes.items()):
        attributes = []
        for atom_id in ct.atom_ids:
            mapping = by_id[atom_id].attributes
            text = texts.get(id(mapping))
            if text is None:
                text = texts[id(mapping)] = json.dumps(mapping, sort_keys=True, default=str)
            attributes.append(text)
        classes.append((name, ct.signature, tuple(attributes)))
    return tuple(classes), tuple(sorted(capacities.items()))


def pool_shapes(
    nodes: Sequence[NodeInventory], capacities: Mapping[str, Mapping[str, Decimal]]
) -> PoolShapes:
    """Group ``nodes`` by static shape. ``capacities``: node id -> resource -> ``floor(allocatable x
    ratio)`` (a node without an entry has no scalar resources)."""
    groups: dict[tuple[Any, ...], list[NodeInventory]] = {}
    classes: set[str] = set()
    resources: set[str] = set()
    keys: set[str] = set()
    texts: dict[int, str] = {}  # kept while ``nodes`` live: an id is not reused meanwhile
    for node in nodes:
        caps = capacities.get(node.id, {})
        groups.setdefault(_shape_key(node, caps, texts), []).append(node)
        resources.update(caps)
        keys.update(node.labels)
        for atom in node.atoms:
            classes.add(atom.device_class)
            keys.update(k for k, v in atom.attributes.items() if v is not None)
    shapes = tuple(
        NodeShape(group[0], capacities.get(group[0].id, {}), tuple(n.labels for n in group))
        for group in groups.values()
    )
    return PoolShapes(shapes, frozenset(classes), frozenset(resources), frozenset(keys))


def _may_match(expressions: tuple[MatchExpression, ...], atom: Atom) -> bool:
    """False only when a device attribute of ``atom`` contradicts an expression (an attribute is
    static; a key the atom lacks reads a node label, which may change, so it never contradicts)."""
    for expr in expressions:
        value = atom.attributes.get(expr.key)
        if value is not None and not expression_holds(expr, value):
            return False
    return True


def _largest_nvlink_set(ct: ClassTopology, indices: list[int]) -> int:
    """The size of the largest set among ``indices`` whose every pair is NV-linked (a maximum clique,
    Bron-Kerbosch with pivoting on bit masks; classes are small: 8 GPUs, at most a few dozen slices)."""
    if len(indices) > MAX_CLIQUE_ATOMS:
        return len(indices)  # not searched: never held against the request
    neighbours = {i: sum(1 << j for j in indices if j != i and ct.ranks[i][j] == NV) for i in indices}
    best = 0

    def expand(size: int, candidates: int, excluded: int) -> None:
        nonlocal best
        if not candidates and not excluded:
            best = max(best, size)
            return
        if size + candidates.bit_count() <= best:
            return
        pivot = max(_bits(candidates | excluded), key=lambda p: (candidates & neighbours[p]).bit_count())
        for v in _bits(candidates & ~neighbours[pivot]):
            expand(size + 1, candidates & neighbours[v], excluded & neighbours[v])
            candidates &= ~(1 << v)
            excluded |= 1 << v

    expand(0, sum(1 << i for i in indices), 0)
    return best


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _device_room(shape: NodeShape, device: DeviceRequest) -> int:
    """How many atoms of ``device`` one node of ``shape`` could give it at most (NVLink-complete ones
    for an nvlink-all request of 2 or more)."""
    ct = node_topology(shape.inventory).classes.get(device.device_class)
    if ct is None:
        return 0
    expressions = device.selector.match_expressions if device.selector is not None else ()
    by_id = {a.id: a for a in shape.inventory.atoms}
    matching = [i for i, atom_id in enumerate(ct.atom_ids) if _may_match(expressions, by_id[atom_id])]
    if device.topology == NVLINK_ALL and device.count > 1:
        return _largest_nvlink_set(ct, matching)
    return len(matching)


def _device_text(device: DeviceRequest) -> str:
    text = f"{device.count} {device.device_class}"
    if device.selector is not None and device.selector.match_expressions:
        text += " matching the selector"
    if device.topology == NVLINK_ALL and device.count > 1:
        text += " NVLink-complete"
    return text


def _shape_holds(node: NodeShape, request: PlacementRequest, memo: dict[Any, Any]) -> bool:
    """Whether one node of ``node``'s shape could hold one copy of ``request`` on its own."""
    wanted: Counter[str] = Counter()
    for device in request.devices:
        if _room(node, device, memo) < device.count:
            return False
        wanted[device.device_class] += device.count
    classes = node_topology(node.inventory).classes
    if any(len(classes[c].atom_ids) < n for c, n in wanted.items() if c in classes):
        return False
    return all(amount <= node.capacities.get(name, Decimal(0)) for name, amount in request.resources.items())


def _room(node: NodeShape, device: DeviceRequest, memo: dict[Any, Any]) -> int:
    key = ("intake-room", id(node), device)
    found = memo.get(key)
    if found is None:
        if len(memo) > 10_000:
            for k in [k for k in memo if isinstance(k, tuple) and k and k[0] == "intake-room"]:
                del memo[k]
        found = memo[key] = _device_room(node, device)
    return int(found)


def judge(
    pool_id: str, shapes: PoolShapes, request: PlacementRequest, memo: dict[Any, Any] | None = None
) -> IntakeVerdict:
    """The :class:`IntakeVerdict` of ``request`` against the pool of ``shapes``, named ``pool_id`` in
    messages (the caller passes the pool's name). ``memo``: a dictionary kept with this inventory
    version (derived values only)."""
    memo = {} if memo is None else memo
    if not shapes.shapes:
        return IntakeVerdict()  # an empty pool: pending, "the pool has no nodes"
    for i, device in enumerate(request.devices):
        if device.device_class not in shapes.device_classes:
            return IntakeVerdict(
                invalid=(
                    f"devices.{i}.class",
                    f"pool {pool_id} has no device class {device.device_class}; "
                    f"it has: {_listed(shapes.device_classes)}",
                )
            )
    for name in request.resources:
        if name not in shapes.resources:
            return IntakeVerdict(
                invalid=(
                    f"resources.{name}",
                    f"pool {pool_id} has no resource {name}; it has: {_listed(shapes.resources)}",
                )
            )
    warnings = tuple(
        f"selector key {expr.key} (devices.{i}) is carried by no device attribute or node label of "
        f"pool {pool_id}"
        for i, device in enumerate(request.devices)
        if device.selector is not None
        for expr in device.selector.match_expressions
        if expr.key not in shapes.selector_keys
    )
    reason = _unsatisfiable(pool_id, shapes, request, memo)
    return IntakeVerdict(unsatisfiable=reason, warnings=tuple(dict.fromkeys(warnings)))


def _listed(names: frozenset[str]) -> str:
    return ", ".join(sorted(names)) if names else "none"


def _unsatisfiable(
    pool_id: str, shapes: PoolShapes, request: PlacementRequest, memo: dict[Any, Any]
) -> str | None:
    # One part the largest node cannot hold on its own names the largest shape for that part.
    for device in request.devices:
        largest = max(_room(node, device, memo) for node in shapes.shapes)
        if largest < device.count:
            return f"no node of pool {pool_id} can hold {_device_text(device)}: the largest has {largest}"
    for name, amount in request.resources.items():
        largest_cap = max(node.capacities.get(name, Decimal(0)) for node in shapes.shapes)
        if amount > largest_cap:
            return (
                f"no node of pool {pool_id} can hold {format_amount(amount)} {name}: "
                f"the largest has {format_amount(largest_cap)}"
            )
    holding = [node for node in shapes.shapes if _shape_holds(node, request, memo)]
    if not holding:
        parts = [_device_text(d) for d in request.devices]
        parts += [f"{format_amount(a)} {n}" for n, a in request.resources.items()]
        return f"no node of pool {pool_id} can hold {' and '.join(parts)} together"
    gang = request.gang
    if gang is None or gang.members <= 1:
        return None
    if gang.topology_key is None:
        able = sum(len(node.node_labels) for node in holding)
        if able < gang.members:
            return (
                f"no {gang.members} nodes of pool {pool_id} can hold a member each: "
                f"the largest set has {able}"
            )
        return None
    domains: Counter[str] = Counter()
    for node in holding:
        domains.update(_domains(shapes, node, gang.topology_key, memo))
    largest_domain = max(domains.values(), default=0)
    if largest_domain < gang.members:
        return (
            f"no {gang.topology_key} of pool {pool_id} has {gang.members} nodes that can hold a member "
            f"each: the largest has {largest_domain}"
        )
    return None


def _domains(shapes: PoolShapes, node: NodeShape, key: str, memo: dict[Any, Any]) -> Counter[str]:
    """How many nodes of ``node``'s shape carry each value of the label ``key`` (memoized per key)."""
    memo_key = ("intake-domains", key)
    per_shape = memo.get(memo_key)
    if per_shape is None:
        per_shape = memo[memo_key] = {
            id(shape): Counter(v for v in (labels.get(key) for labels in shape.node_labels) if v is not None)
            for shape in shapes.shapes
        }
    return per_shape.get(id(node), Counter())
