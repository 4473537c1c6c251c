"""The shortlist's pure ranking (docs/architecture.md; the rule is in the I/O half's
:mod:`app.capacity.planning.plan` docstring): which requests the shortlist applies to, its size K,
the :class:`Exceptions` value the narrow reads produce, the count-score ranking of a pool's inventory
index (:func:`shortlist_rows`: alike free nodes grouped by atom counts, selector matches memoized per
static node signature, nodeLabels checks), and the completeness proof (:func:`pick_ceiling`,
:func:`provably_complete`). No SQL, no clock: the reads live in :mod:`app.capacity.planning`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from app.placement.bounds import pick_score_ceiling
from app.placement.context import selector_token
from app.placement.model import NodeInventory, PlacementRequest, Plan, PoolInventory, Selector
from app.placement.options import SchedulerOptions
from app.placement.reads import request_key
from app.placement.scorers import scorers_of
from app.placement.scorers.contract import NODE
from app.placement.selectors import selector_matches as matches_selector
from app.placement.system_labels import unmet_label

TIE_MARGIN = 1e-9  # float noise between SQL and Python arithmetic: never trust a bound closer than this

# What the shortlist reads of the request (names of app/placement/reads.py): its memos are keyed by
# these values (free_groups per inventory version, shortlist_rows' touched scores per batch), and
# tests/placement/test_shortlist_reads.py records every read of both through proxies against them.
FREE_GROUPS_READS: tuple[str, ...] = (
    "devices",
    "devices.device_class",
    "devices.count",
    "devices.selector",
    "resources.names",
)
SHAPE_READS: tuple[str, ...] = (*FREE_GROUPS_READS, "node_labels")


class TouchedScores(Protocol):
    """A batch's memo of touched nodes' count scores (the I/O half's per-window group)."""

    def touched_scores(
        self, key: Any, touched: Iterable[str], score: Callable[[str], float | None]
    ) -> dict[str, float | None]:
        """node id -> ``score(node id)`` for ``touched``, memoized under ``key`` (the request shape)."""
        ...


def shortlist_applies(request: PlacementRequest, options: SchedulerOptions) -> bool:
    """No gang and no plugin scorers (and a device-binding request), and no registered ``NODE`` scorer
    (its score cannot be bounded from inventory). A device selector no longer keeps a request off the
    shortlist (issue 15): which atoms match is static, memoized in the pool cache per (selector, node
    signature) (:func:`selector_matches`), and a selector changes no count score (binpack and spread count
    the class's free atoms, selector aside), only which nodes are viable."""
    return (
        request.gang is None
        and request.binding != "node"
        and not any(getattr(p, "scorers", ()) for p in options.plugins)
        and NODE not in scorers_of(options).kinds
    )


def shortlist_size(options: SchedulerOptions, shortlist_min: int) -> int:
    """K = max(shortlist_min (48), 8 x topN)."""
    return max(shortlist_min, 8 * options.top_n)


@dataclass(frozen=True, slots=True)
class Exceptions:
    """What the narrow reads found for the window: the nodes that are not simply free and schedulable.

    ``booked`` / ``unavailable``: node id -> atoms booked over the window / unhealthy or unbookable;
    ``reasons``: node id -> NoSchedule reasons (nodes with none are absent); ``unschedulable``: nodes the
    SQL predicate refuses for the tenant; ``short``: nodes without room for a requested scalar over the
    window; ``peaks``: node id -> requested resource -> the peak it holds over the window, for the nodes
    whose holdings over the window sum to more than leaves room (the others have room at every instant
    and are absent)."""

    booked: dict[str, set[str]]
    unavailable: dict[str, set[str]]
    reasons: dict[str, tuple[str, ...]]
    unschedulable: frozenset[str]
    short: frozenset[str]
    peaks: dict[str, dict[str, Decimal]] = field(default_factory=dict)

    def busy(self, node_id: str) -> set[str]:
        """Atoms of the node that are not free for the window."""
        return self.booked.get(node_id, set()) | self.unavailable.get(node_id, set())


def class_atoms(inventory: PoolInventory) -> dict[str, dict[str, frozenset[str]]]:
    """node id -> class -> its atom ids (memoized per inventory version)."""
    found = inventory.memo.get("class-atoms")
    if found is None:
        found = {}
        for node_id, node in inventory.nodes.items():
            by_class: dict[str, set[str]] = {}
            for atom in node.atoms:
                by_class.setdefault(atom.device_class, set()).add(atom.id)
            found[node_id] = {c: frozenset(a) for c, a in by_class.items()}
        inventory.memo["class-atoms"] = found
    return found


def selector_matches(
    inventory: PoolInventory, device_class: str, selector: Selector
) -> dict[str, frozenset[str]]:
    """node id -> the node's atoms of ``device_class`` that ``selector`` matches (the pipeline's rule,
    :func:`app.placement.selectors.selector_matches`). Memoized per inventory version and selector, and
    computed once per (selector, static node signature): the signature is the node's values and sources
    of the label keys the selector reads and its atoms' attribute objects (nodes of one model share
    them: the pool load parses each distinct attribute text once), so a pool of alike hosts matches
    once per kind of host, as the pick memo picks once per link signature."""
    key = ("selector-matches", device_class, selector_token(selector))
    found = inventory.memo.get(key)
    if found is None:
        keys = sorted({e.key for e in selector.match_expressions})
        by_signature: dict[tuple[Any, ...], tuple[int, ...]] = {}
        found = {}
        for node_id, node in inventory.nodes.items():
            atoms = [a for a in node.atoms if a.device_class == device_class]
            signature = (
                tuple((k, node.labels.get(k), node.label_sources.get(k)) for k in keys),
                tuple(id(a.attributes) for a in atoms),
            )
            positions = by_signature.get(signature)
            if positions is None:
                positions = by_signature[signature] = tuple(
                    i for i, a in enumerate(atoms) if matches_selector(selector, a, node)
                )
            found[node_id] = frozenset(atoms[i].id for i in positions)
        inventory.memo[key] = found
    return found


def request_matches(
    inventory: PoolInventory, request: PlacementRequest
) -> list[dict[str, frozenset[str]] | None]:
    """Per device request: node id -> its matching atoms, or None when the request has no selector."""
    return [
        selector_matches(inventory, d.device_class, d.selector)
        if d.selector is not None and d.selector.match_expressions
        else None
        for d in request.devices
    ]


def free_groups(
    inventory: PoolInventory, request: PlacementRequest
) -> dict[tuple[int, ...], tuple[str, ...]]:
    """The nodes that could hold the request when entirely free, grouped by their atom count of each
    requested class (node ids in order); nodes lacking a requested scalar resource, or with fewer atoms
    matching a device request's selector than its count, are left out. Memoized per inventory version
    and request shape: a free node's count score depends on nothing else."""
    classes = tuple(d.device_class for d in request.devices)
    counts = tuple(d.count for d in request.devices)
    resources = frozenset(request.resources)
    key = ("groups", request_key(request, FREE_GROUPS_READS))
    found = inventory.memo.get(key)
    if found is None:
        atoms = class_atoms(inventory)
        matching = request_matches(inventory, request)
        grouped: dict[tuple[int, ...], list[str]] = {}
        for node_id in inventory.order:
            if not resources <= inventory.resource_names.get(node_id, frozenset()):
                continue
            if any(m is not None and len(m[node_id]) < n for m, n in zip(matching, counts, strict=True)):
                continue
            have = atoms[node_id]
            totals = tuple(len(have.get(c, ())) for c in classes)
            if all(t >= n for t, n in zip(totals, counts, strict=True)):
                grouped.setdefault(totals, []).append(node_id)
        found = inventory.memo[key] = {t: tuple(ids) for t, ids in grouped.items()}
    return found


def labels_hold(node: NodeInventory, wanted: Mapping[str, str]) -> bool:
    return unmet_label(wanted.items(), node.labels, node.label_sources) is None


def shape_key(request: PlacementRequest, options: SchedulerOptions) -> Any:
    """What a touched node's count score depends on besides the node: the values of
    :data:`SHAPE_READS` (what :func:`shortlist_rows` reads of the request), the scorers and weights."""
    return (request_key(request, SHAPE_READS), scorers_of(options), tuple(sorted(options.weights.items())))


def shortlist_rows(
    inventory: PoolInventory,
    request: PlacementRequest,
    options: SchedulerOptions,
    exceptions: Exceptions,
    limit: int,
    group: TouchedScores | None = None,
) -> list[tuple[str, float]]:
    """The best ``limit`` viable nodes as ``(node id, count score)``, best first, ties on node id.

    Viable: schedulable for the tenant (the SQL predicate), not excluded, carrying the request's
    nodeLabels, with room for every scalar and enough free atoms of every class (matching the device
    request's selector, if any). Score: the count-only part (the ``COUNTS`` scorers'
    ``count_score_many``). Nodes with no exception are ranked per group
    of alike nodes (one score per group, ids in order), so the cost is the exceptions plus groups x
    ``limit``, not the pool's size. With a batch's ``group`` (whose ``exceptions`` these are) the touched
    nodes' scores are memoized per request shape and recomputed only for the nodes the batch's plans
    or the process's assumptions changed since (:meth:`TouchedScores.touched_scores`)."""
    count_score_many, weights = scorers_of(options).count_score_many, options.weights
    counts = [(d.device_class, d.count) for d in request.devices]
    atoms = class_atoms(inventory)
    matching = request_matches(inventory, request)
    skip = exceptions.unschedulable | exceptions.short | options.excluded_nodes
    touched = set(exceptions.booked) | set(exceptions.unavailable)
    wanted_labels = request.node_labels

    def viable(node_id: str) -> bool:
        return node_id not in skip and (
            not wanted_labels or labels_hold(inventory.nodes[node_id], wanted_labels)
        )

    ranked: list[tuple[float, str]] = []
    for totals, ids in free_groups(inventory, request).items():
        score = count_score_many([(t, 0, n) for t, (_c, n) in zip(totals, counts, strict=True)], weights)
        taken = 0
        for node_id in ids:
            if taken >= limit:
                break
            if node_id in touched or not viable(node_id):
                continue
            ranked.append((-score, node_id))
            taken += 1
    wanted_resources = frozenset(request.resources)

    def touched_score(node_id: str) -> float | None:
        """The count score of a touched node, None when it cannot hold the request (skip aside)."""
        node_atoms = atoms.get(node_id)
        if node_atoms is None:
            return None
        if wanted_labels and not labels_hold(inventory.nodes[node_id], wanted_labels):
            return None
        if not wanted_resources <= inventory.resource_names.get(node_id, frozenset()):
            return None
        busy = exceptions.busy(node_id)
        parts = []
        for (device_class, count), matches in zip(counts, matching, strict=True):
            class_atoms = node_atoms.get(device_class, frozenset())
            taken_atoms = len(class_atoms & busy)
            if len(class_atoms) - taken_atoms < count:
                return None
            if matches is not None and len(matches[node_id] - busy) < count:
                return None  # fewer free atoms match the selector than the count: the pipeline's fits
            parts.append((len(class_atoms), taken_atoms, count))
        return count_score_many(parts, weights) if parts else 0.0

    scores = (
        group.touched_scores(shape_key(request, options), touched, touched_score)
        if group is not None
        else {node_id: touched_score(node_id) for node_id in touched}
    )
    for node_id, found in scores.items():
        if found is not None and node_id not in skip:
            ranked.append((-found, node_id))
    ranked.sort()
    return [(node_id, -neg) for neg, node_id in ranked[:limit]]


def pick_ceiling(inventory: PoolInventory, request: PlacementRequest, options: SchedulerOptions) -> float:
    """The most any node of the pool could add through the ``PICK`` scorers (memoized per version)."""
    scorers = scorers_of(options)
    key = (
        "pick-ceiling",
        tuple((d.device_class, d.count) for d in request.devices),
        tuple(sorted(options.weights.items())),
        scorers,
    )
    found = inventory.memo.get(key)
    if found is None:
        found = inventory.memo[key] = pick_score_ceiling(
            inventory.nodes.values(), request.devices, options.weights, scorers
        )
    return found


def provably_complete(plan: Plan, rows: list[tuple[str, float]], k: int, needed: int, ceiling: float) -> bool:
    if len(rows) <= k:
        return True  # every viable node is in the shortlist
    bound = rows[k][1] + ceiling
    if len(plan.ranked) < needed:
        return False
    last = plan.ranked[needed - 1]
    if last.score > bound + TIE_MARGIN:
        return True
    # A tie at the bound: only an outside node with the best outside count score can reach it, and the
    # SQL orders equal count scores by node id, so rows[k] has the smallest id of those; ties in the
    # pipeline also break on node id, so the inside node keeps its place when its id is smaller.
    return abs(last.score - bound) <= TIE_MARGIN and last.node_id < rows[k][0]
