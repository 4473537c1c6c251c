"""``plan_placement``: the pure half of placement (docs/placement-rules.md, "The pipeline").

Snapshot in, plan out: no SQL, no clock, no I/O. For every node of the snapshot the filters run in
registry order (:mod:`app.placement.filters`) and the first reason rejects it; the survivors are scored
(:mod:`app.placement.scorers` plus plugin scorers), ranked by total score (ties on node id), and the
chosen one is a ``random.Random(options.seed)`` pick among the best ``top_n``.

Speed (issue 3: 10,000 nodes x 8 GPUs under 200 ms, i.e. 20 µs a node): the atom pick is memoized in
:mod:`app.placement.topology`; a node goes only through the steps that can matter for the request
(:func:`app.placement.filters.plan_steps`: filters that cannot reject it are left out); the built-in
scores depend only on what the scorers declare (for ``COUNTS`` and ``PICK`` scorers: link signature,
free-of-class mask, free-and-matching mask; :meth:`ScorerSet.share_key`), so nodes alike share one
read-only scores mapping; and the cyclic garbage collector is paused during the loop, because the
loop allocates a few short-lived, acyclic objects per node and a collection in the middle would walk
the whole snapshot (millions of objects) for nothing: that alone cost 50-90 ms on a 10,000-node pool.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Hashable
from dataclasses import replace
from functools import cache
from types import MappingProxyType, ModuleType

from app.placement.context import NodeWork, PlanContext
from app.placement.derived import DERIVATIONS, derivations_for
from app.placement.filters import EXCLUDED, FILTER_OF_STEP, FILTERS, applies, lease, plan_steps, schedulable
from app.placement.model import Candidate, NodeSnapshot, PlacementRequest, Plan, PoolSnapshot, Rejections
from app.placement.options import LOST_RACE_REASON, SchedulerOptions
from app.placement.plugins import admission_refusal, clamp_score
from app.placement.reads import Reads, check_declared, request_key, union
from app.placement.schedulable import POOL_ARCHIVED
from app.placement.scorers import scorers_of
from app.placement.scorers.contract import ScorerSet
from app.placement.summary import ARCHIVED_POOL, EMPTY_POOL, summarize
from app.placement.topology import tied_picks

DEFAULT_OPTIONS = SchedulerOptions()


# node id -> (the node snapshot it was planned on, its rejection reason or candidate, the rejecting
# filter's name or "")
NodeMemo = dict[str, tuple[NodeSnapshot, "str | Candidate", str]]
# memo key (:func:`memo_key`) -> the per-node memo of the requests with that key
NodeMemos = dict[Hashable, NodeMemo]

# what the pipeline itself reads of the request besides its filters and scorers: a lease's binding
# (the whole node is claimed) and the resources (the candidate's claim)
REQUEST_READS: tuple[str, ...] = ("binding", "resources")


@cache
def memo_fields(filters: tuple[ModuleType, ...], scorers: ScorerSet) -> Reads:
    """The request fields a node's outcome depends on: the union of the ``REQUEST_READS`` declared by
    ``filters`` (those declaring none aside: :func:`memo_key` checks them per request), the derivations,
    ``scorers`` and the pipeline itself; None when a scorer's are undeclared. Raises
    :class:`~app.placement.reads.UnknownReadError` for a declared name that is not a request field.
    docs/extending.md, "What a filter reads"."""
    parts: list[Reads] = [REQUEST_READS, scorers.request_reads]
    for flt in filters:
        declared = getattr(flt, "REQUEST_READS", None)
        check_declared(f"filter {flt.NAME}", declared, getattr(flt, "NODE_READS", None))
        if declared is not None:
            parts.append(tuple(declared))
    for d in DERIVATIONS:
        check_declared(f"derivation {d.name}", d.request_reads, d.node_reads)
        parts.append(d.request_reads)
    return union(parts)


def memo_key(
    ctx: PlanContext, scorers: ScorerSet, filters: tuple[ModuleType, ...] = FILTERS
) -> tuple[Hashable, ...] | None:
    """The key of ``ctx.request``'s per-node memo: the values of :func:`memo_fields`, the scorers and
    the weights; two requests with equal keys get the same outcome on the same node snapshot. None (no
    memo) when plugins are in use, a scorer's reads are undeclared, or a filter that declares no
    ``REQUEST_READS`` applies to the request (it may read anything)."""
    if ctx.options.plugins:
        return None
    fields = memo_fields(filters, scorers)
    if fields is None:
        return None
    for flt in filters:
        if getattr(flt, "REQUEST_READS", None) is None and applies(flt, ctx):
            return None
    return (request_key(ctx.request, fields), scorers, tuple(sorted(ctx.options.weights.items())))


def plan_placement(
    request: PlacementRequest,
    snapshot: PoolSnapshot,
    options: SchedulerOptions = DEFAULT_OPTIONS,
    memo: NodeMemos | None = None,
) -> Plan | Rejections:
    """Plan ``request`` on ``snapshot``.

    Returns a :class:`Plan` (``chosen``, every candidate ``ranked`` best first, ``rejections`` node id
    -> reason) or :class:`Rejections` (``by_node`` and the pending ``summary``). Nodes in
    ``options.excluded_nodes`` are rejected with ``options.exclusion_reasons`` (or "excluded after a
    lost commit race"). A plugin's admit hook refusing gives ``Rejections({}, "admit <id>: <reason>")``;
    an empty pool ``the pool has no nodes``; an archived pool ``the pool is archived``.

    ``memo`` (:data:`NodeMemos`): the caller's store of per-node outcomes kept across plans (a batch's).
    The plan uses the :data:`NodeMemo` under :func:`memo_key` (derived from what the filters, the
    derivations and the scorers declare they read of the request, docs/extending.md, "What a filter
    reads"), reusing a node's outcome while its snapshot is the same object; none when the key is None
    (plugins, or an undeclared step applies) or the pool is archived. Seeds and exclusions apply after.
    """
    refusal = admission_refusal(options.plugins, request)
    if refusal is not None:
        return Rejections(by_node={}, summary=refusal)
    nodes = snapshot.nodes
    if not nodes:
        return Rejections(by_node={}, summary=EMPTY_POOL)
    if snapshot.archived:
        return Rejections(
            by_node={n.id: POOL_ARCHIVED for n in nodes},
            summary=ARCHIVED_POOL,
            filters={n.id: schedulable.NAME for n in nodes},
        )

    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return _plan(request, snapshot, options, memo)
    finally:
        if paused:
            gc.enable()


def _plan(
    request: PlacementRequest, snapshot: PoolSnapshot, options: SchedulerOptions, memos: NodeMemos | None
) -> Plan | Rejections:
    nodes = snapshot.nodes
    ctx = PlanContext.build(request, snapshot, options)
    n_devices = len(ctx.devices)
    excluded = options.excluded_nodes
    scorers = scorers_of(options)
    memo: NodeMemo | None = None
    if memos is not None and not snapshot.archived:
        key = memo_key(ctx, scorers)
        if key is not None:
            memo = memos.setdefault(key, {})
    weighted = [(s.name, s.score_fn(), options.weight(s.name, s.default_weight)) for s in scorers.scorers]
    plugin_scorers = ctx.plugin_scorers
    resources = dict(ctx.resources)
    rejections: dict[str, str] = {}
    filtered: dict[str, str] = {}  # node id -> the rejecting filter's name
    candidates: list[Candidate] = []
    steps = plan_steps(ctx, scorers.reads)
    # Built-in scores shared by alike nodes under a key derived from the scorers' declarations (None:
    # a NODE scorer or a plugin picker, no sharing).
    share_key = scorers.share_key(n_devices, bool(ctx.pickers))
    shared: dict[object, tuple[MappingProxyType[str, float], float]] = {}

    for node in nodes:
        node_id = node.inventory.id
        if excluded and node_id in excluded:
            rejections[node_id] = options.exclusion_reasons.get(node_id, LOST_RACE_REASON)
            filtered[node_id] = EXCLUDED
            continue
        known = memo.get(node_id) if memo is not None else None
        if known is not None and known[0] is node:
            if isinstance(known[1], str):
                rejections[node_id] = known[1]
                filtered[node_id] = known[2]
            else:
                candidates.append(known[1])
            continue
        work = NodeWork(node, n_devices)
        reason = None
        for step in steps:
            reason = step(ctx, work)
            if reason is not None:
                filtered[node_id] = FILTER_OF_STEP[step]
                break
        if reason is not None:
            rejections[node_id] = reason
            if memo is not None:
                memo[node_id] = (node, reason, filtered[node_id])
            continue
        key = share_key(work) if share_key is not None else None
        found = shared.get(key) if key is not None else None
        if found is None:
            builtin: dict[str, float] = {}
            total = 0.0
            for name, score, weight in weighted:
                value = score(ctx, work)
                builtin[name] = value
                total += weight * value
            found = (MappingProxyType(builtin), total)
            if key is not None:
                shared[key] = found
        scores, total = found
        if plugin_scorers:
            with_plugins = dict(scores)
            for scorer, weight in plugin_scorers:
                value = clamp_score(scorer.score(request, node))
                with_plugins[scorer.id] = value
                total += weight * value
            scores = MappingProxyType(with_plugins)
        atoms_by_request, claimed, held = tuple(work.atoms), resources, ()
        if request.binding == lease.NODE_BINDING:  # a lease takes the whole node for its window
            atoms_by_request, claimed, held = lease.whole_node(node, atoms_by_request)
        candidate = Candidate(
            node_id=node_id,
            node_name=node.inventory.name,
            atoms_by_request=atoms_by_request,
            resources=claimed,
            score=total,
            scores=scores,
            held_atoms=held,
        )
        candidates.append(candidate)
        if memo is not None:
            memo[node_id] = (node, candidate, "")

    if not candidates:
        return Rejections(by_node=rejections, summary=summarize(rejections, len(nodes)), filters=filtered)
    candidates.sort(key=lambda c: (-c.score, c.node_id))
    best = min(max(options.top_n, 1), len(candidates))
    rng = random.Random(options.seed)
    chosen = candidates[rng.randrange(best)]
    chosen = _vary_atoms(ctx, next(n for n in nodes if n.inventory.id == chosen.node_id), chosen, rng)
    return Plan(chosen=chosen, ranked=tuple(candidates), rejections=rejections, filters=filtered)


def _vary_atoms(ctx: PlanContext, node: NodeSnapshot, chosen: Candidate, rng: random.Random) -> Candidate:
    """The chosen node's atoms, each device request's set drawn (seeded) among the sets the greedy pick
    ties on (:func:`app.placement.topology.tied_picks`): same worst link, same NUMA spread, so the same
    scores. Plugin pickers' sets are kept as they are."""
    if not ctx.devices or ctx.request.binding == lease.NODE_BINDING:  # a lease takes every atom anyway
        return chosen
    work = NodeWork(node, len(ctx.devices))
    for derivation in derivations_for(("classes", "free_masks")):
        derivation.run(ctx, work)
    groups = list(chosen.atoms_by_request)
    for i, device in enumerate(ctx.devices):
        ct = work.classes[i]
        if ct is None or device.device_class in ctx.pickers:
            continue
        options = tied_picks(ct, work.free_masks[i], device.count)
        if len(options) > 1:
            groups[i] = tuple(ct.atom_ids[j] for j in options[rng.randrange(len(options))])
    return replace(chosen, atoms_by_request=tuple(groups))
