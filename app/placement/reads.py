"""What a plan reads of the request and the node, named (issue 21; docs/extending.md, "What a filter
reads").

Every filter (:mod:`app.placement.filters`), derivation (:mod:`app.placement.derived`) and scorer kind
(:mod:`app.placement.scorers.contract`) declares, next to its ``NAME``, the request fields it reads
(``REQUEST_READS``, names from :data:`REQUEST_FIELDS`) and the node fields it reads (``NODE_READS``,
names from :data:`NODE_FIELDS`). A per-node memo kept across the plans of several requests (a batch's,
the pool-lease worker's) is keyed by the values of the union of the declared request fields
(:func:`request_key`): two requests with equal values there get the same per-node outcome. A
declaration of ``None`` (or none at all) means "reads anything": the memo is off for the requests that
step sees. Node reads need no key: a memoized outcome is reused only while the node's snapshot is the
same object (:func:`app.placement.pipeline.plan_placement`).

``tests/placement/test_declared_reads.py`` runs every registered step over many requests and nodes
through recording proxies and fails on a read that is not declared.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from functools import cache
from types import MappingProxyType

from app.placement.context import amount_decimal, selector_token
from app.placement.model import PlacementRequest

Reads = tuple[str, ...] | None  # None: undeclared, reads anything


def _resources(r: PlacementRequest) -> Hashable:
    return tuple((name, amount_decimal(v)) for name, v in r.resources.items())  # request order matters


# request field -> its value as a memo key part (hashable; order kept where a reason depends on it)
REQUEST_FIELDS: Mapping[str, Callable[[PlacementRequest], Hashable]] = MappingProxyType(
    {
        "tenant_id": lambda r: r.tenant_id,
        "pool_id": lambda r: r.pool_id,
        "binding": lambda r: r.binding,
        "spot": lambda r: r.spot,
        "gang": lambda r: r.gang,
        "start": lambda r: r.start,
        "end": lambda r: r.end,
        "resources": _resources,
        "resources.names": lambda r: frozenset(r.resources),  # which resources, not how much
        "node_labels": lambda r: tuple(r.node_labels.items()),
        "devices": lambda r: len(r.devices),  # how many device requests
        "devices.device_class": lambda r: tuple(d.device_class for d in r.devices),
        "devices.count": lambda r: tuple(d.count for d in r.devices),
        "devices.selector": lambda r: tuple(selector_token(d.selector) for d in r.devices),
        "devices.topology": lambda r: tuple(d.topology for d in r.devices),
    }
)

# what a step may read of a node (NodeSnapshot.inventory.* and .state.*)
NODE_FIELDS: frozenset[str] = frozenset(
    {
        "inventory.id",
        "inventory.name",
        "inventory.labels",
        "inventory.label_sources",
        "inventory.atoms",
        "inventory.links",
        "state.no_schedule_reasons",
        "state.leasable",
        "state.unavailable",
        "state.booked",
        "state.resources",
    }
)


class UnknownReadError(ValueError):
    """A declaration names a field that :data:`REQUEST_FIELDS` / :data:`NODE_FIELDS` do not know."""


def check_declared(owner: str, request_reads: Reads, node_reads: Reads) -> None:
    """Raise :class:`UnknownReadError` naming ``owner`` when a declared name is not a known field."""
    for names, known, what in ((request_reads, REQUEST_FIELDS, "request"), (node_reads, NODE_FIELDS, "node")):
        unknown = [n for n in names or () if n not in known]
        if unknown:
            raise UnknownReadError(f"{owner} declares unknown {what} fields {unknown}")


@cache
def _getters(fields: tuple[str, ...]) -> tuple[Callable[[PlacementRequest], Hashable], ...]:
    return tuple(REQUEST_FIELDS[f] for f in fields)


def union(parts: Iterable[Reads]) -> Reads:
    """The declared request fields of several steps, sorted and without repeats; None when any is
    undeclared."""
    fields: set[str] = set()
    for part in parts:
        if part is None:
            return None
        fields.update(part)
    return tuple(sorted(fields))


def request_key(request: PlacementRequest, fields: tuple[str, ...]) -> tuple[Hashable, ...]:
    """The values of ``fields`` (known names, in order) for ``request``: equal keys, equal reads."""
    return tuple(get(request) for get in _getters(fields))
