"""Frozen data the placement pipeline works on (docs/placement-rules.md, "The pipeline";
docs/architecture.md).

The I/O half (``app/capacity``) builds these from PostgreSQL: the static part of a node
(:class:`NodeInventory`, cached per pool and inventory version) and its volatile part (:class:`NodeState`,
read per request for the request's ``[start, end)`` window). ``plan_placement`` takes them and returns a
:class:`Plan` or :class:`Rejections`. Nothing here knows about SQL, clocks or HTTP.

Units: scalar amounts are ``Decimal`` in the resource's own unit (cpu in cores, memory in MiB unless the
operator chose otherwise); times are timezone-aware ``datetime`` carried as data only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

SelectorOp = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Gte", "Lt", "Lte"]
SELECTOR_OPS: tuple[str, ...] = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Gte", "Lt", "Lte")
COMPARISON_OPS: frozenset[str] = frozenset({"Gt", "Gte", "Lt", "Lte"})
SET_OPS: frozenset[str] = frozenset({"In", "NotIn"})
MAX_EXPRESSIONS = 32  # docs/placement-rules.md, "Device fit and selectors"
MAX_VALUES = 64

NVLINK_ALL = "nvlink-all"


@dataclass(frozen=True, slots=True)
class MatchExpression:
    """One selector term. ``values`` are strings for In/NotIn, one ``Decimal`` for the comparisons,
    empty for Exists/DoesNotExist (docs/placement-rules.md, "Device fit and selectors")."""

    key: str
    op: SelectorOp
    values: tuple[str | Decimal, ...] = ()


@dataclass(frozen=True, slots=True)
class Selector:
    """A list of matchExpressions, all of which must hold."""

    match_expressions: tuple[MatchExpression, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """``count`` atoms of ``device_class`` (e.g. ``gpu``) matching ``selector``; ``topology`` is
    ``'nvlink-all'`` or ``None``."""

    device_class: str
    count: int
    selector: Selector | None = None
    topology: str | None = None


@dataclass(frozen=True, slots=True)
class Gang:
    """``members`` placements of the same shape on distinct nodes sharing ``topology_key``'s label value."""

    members: int
    topology_key: str | None = None


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    """What to place: devices and scalar resources in one pool for the half-open window ``[start, end)``.

    ``node_labels`` maps a label key to the wanted value or ``'*'`` (any value); it is set only by
    modules through the capacity port, never by API callers (docs/placement-rules.md, nodeLabels paragraph).
    """

    tenant_id: str
    pool_id: str
    devices: tuple[DeviceRequest, ...] = ()
    resources: Mapping[str, Decimal] = field(default_factory=dict)
    start: datetime | None = None
    end: datetime | None = None
    node_labels: Mapping[str, str] = field(default_factory=dict)
    binding: Literal["device", "node", "kubernetes"] = "device"
    gang: Gang | None = None
    spot: bool = False


NUMA_NODE_ATTRIBUTE = "numaNode"


def selectable_attributes(attributes: Mapping[str, Any], numa_node: int | None) -> Mapping[str, Any]:
    """The attributes a selector reads on an atom (docs/selectors.md, "Device attributes"): the stored
    ``attributes`` with the atom's NUMA node as ``numaNode`` (an integer), whatever path registered the
    device. ``attributes`` is returned itself when it says so already (or the NUMA node is unknown), so
    atoms of alike nodes keep sharing one mapping; else a new dict. The ``numa_node`` column wins over a
    stored ``numaNode`` attribute: it is what the atom pick and the ``numa`` scorer read."""
    if numa_node is None or attributes.get(NUMA_NODE_ATTRIBUTE) == numa_node:
        return attributes
    return {**attributes, NUMA_NODE_ATTRIBUTE: numa_node}


@dataclass(frozen=True, slots=True)
class Atom:
    """One bookable unit on a node: a whole GPU (``GPU-<uuid>``) or a MIG slice (``MIG-<uuid>``, with
    ``parent`` naming its GPU). ``attributes`` holds gpuProduct, vramGiB, computeCapability, ... ."""

    id: str
    device_class: str
    attributes: Mapping[str, Any] = field(default_factory=dict)
    numa_node: int | None = None
    parent: str | None = None


@dataclass(frozen=True, slots=True)
class ScalarResource:
    """A node's scalar resource (a node_resources row) as a plan sees it for one window: room =
    floor(allocatable x ratio) - allocated, where ``allocated`` is the peak the node holds at any instant
    of the request's window (the snapshot reads compute it from scalar_holdings)."""

    allocatable: Decimal
    ratio: Decimal = Decimal(1)
    allocated: Decimal = Decimal(0)


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """The static part of a node, cached per pool and inventory version (docs/architecture.md, "Performance
    architecture"). ``links`` maps an ordered pair ``(a, b)`` with ``a < b`` of atom ids to the
    nvidia-smi link text (``NV12``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``); a missing pair is an
    unknown link. ``label_sources`` maps each label key to ``system`` or ``operator``."""

    id: str
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    label_sources: Mapping[str, str] = field(default_factory=dict)
    atoms: tuple[Atom, ...] = ()
    links: Mapping[tuple[str, str], str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeState:
    """The volatile part of a node, read per request for the window ``[start, end)``.

    ``no_schedule_reasons`` is ``nodes.no_schedule_reasons`` (``cordoned``, ``not ready``, ``heartbeat
    lost``, ``tainted <key>=<value>``); ``unavailable`` holds atoms that are unhealthy or unbookable;
    ``booked`` atoms with a booking overlapping the window."""

    no_schedule_reasons: tuple[str, ...] = ()
    leasable: bool = True
    unavailable: frozenset[str] = frozenset()
    booked: frozenset[str] = frozenset()
    resources: Mapping[str, ScalarResource] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """A node as the pipeline sees it: static inventory plus volatile state."""

    inventory: NodeInventory
    state: NodeState

    @property
    def id(self) -> str:
        return self.inventory.id

    @property
    def name(self) -> str:
        return self.inventory.name


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """A pool and the nodes to consider (the whole pool, or a shortlist of it)."""

    id: str
    archived: bool = False
    nodes: tuple[NodeSnapshot, ...] = ()


@dataclass(frozen=True, slots=True)
class Candidate:
    """A node that passed every filter: the atoms picked per device request (in request order), the
    scalar amounts claimed, the weighted total ``score`` and its per-scorer parts ``scores``.
    ``held_atoms``: what a whole-node lease books without using, the node's atoms that were unhealthy
    or unbookable when it was planned, so that nothing else lands on them once they heal
    (docs/lifecycle.md, "Whole-node leases"); empty for every other binding."""

    node_id: str
    node_name: str
    atoms_by_request: tuple[tuple[str, ...], ...]
    resources: Mapping[str, Decimal]
    score: float
    scores: Mapping[str, float]
    held_atoms: tuple[str, ...] = ()

    @property
    def atoms(self) -> tuple[str, ...]:
        """Every picked atom, flattened in request order."""
        return tuple(a for group in self.atoms_by_request for a in group)

    @property
    def booked_atoms(self) -> tuple[str, ...]:
        """Every atom the commit books: the picked ones, then :attr:`held_atoms`."""
        return (*self.atoms, *self.held_atoms)


@dataclass(frozen=True, slots=True)
class Plan:
    """A placement decision: ``chosen`` (a seeded random pick among the best topN of ``ranked``),
    ``ranked`` (every candidate, best first, ties on node id) and ``rejections`` (node id -> reason)."""

    chosen: Candidate
    ranked: tuple[Candidate, ...]
    rejections: Mapping[str, str] = field(default_factory=dict)
    # a gang's members on distinct nodes (``chosen`` is the first); empty for a one-member request
    members: tuple[Candidate, ...] = ()
    # node id -> the name of the filter that rejected it (the nodes of ``rejections``); not compared
    filters: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def placements(self) -> tuple[Candidate, ...]:
        """What to commit: the gang's members, or the one chosen candidate."""
        return self.members or (self.chosen,)


@dataclass(frozen=True, slots=True)
class Rejections:
    """Nothing fits: ``by_node`` maps node id -> reason text; ``summary`` is the pending reason
    (``no node fits (3 nodes): 2 × fits: 1 of 4 gpu free; 1 × cordoned``)."""

    by_node: Mapping[str, str]
    summary: str
    # node id -> the name of the filter that rejected it (``excluded``: a node lost on in a commit race;
    # ``gang``: a gang's grouping), for the rejection rows (:mod:`app.placement.why_not`); not compared
    filters: Mapping[str, str] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class PoolInventory:
    """The cached static part of one pool at one inventory version: node id -> NodeInventory."""

    version: int
    nodes: dict[str, NodeInventory]
    order: tuple[str, ...]
    # scalar resources each node has a row for (rows come and go only with inventory changes)
    resource_names: dict[str, frozenset[str]] = field(default_factory=dict)
    # node id -> resource -> floor(allocatable x ratio): both columns change only with inventory changes
    capacities: dict[str, dict[str, Decimal]] = field(default_factory=dict)
    name: str = ""  # the pool's name (names never change), for messages
    # derived values that depend only on this static inventory (e.g. the shortlist's score ceilings)
    memo: dict[Any, Any] = field(default_factory=dict)
