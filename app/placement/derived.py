"""Per-node precomputations, declared in one place (issue 16: filters own their state).

A filter never reads what another filter wrote. What several of them need about a node for the request
is derived here, each :class:`Derivation` filling fields of :class:`~app.placement.context.NodeWork`
from the node and the request (and the fields it ``needs``), never from a filter's verdict:

- ``matches`` fills ``classes`` (per device request, the node's
  :class:`~app.placement.topology.ClassTopology` of the class, None when it has none) and
  ``match_masks`` (the atoms of the class matching the request's selector; all of them without one).
  Static inventory only: the masks are cached per inventory object and selector.
- ``free`` fills ``available_masks`` (atoms of the class free for the window: healthy, bookable and
  unbooked, selector aside) and ``free_masks`` (free and matching).

A filter lists the fields it reads in ``READS``; the registry (:func:`app.placement.filters.plan_steps`)
runs each derivation once, just before the first filter (or scorer) that reads it. The pick (``picks``,
``atoms``) is the ``picker`` filter's own output (its ``WRITES``), read by scorers only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from app.placement.context import NodeWork, PlanContext
from app.placement.selectors import selector_matches

Step = Callable[[PlanContext, NodeWork], "str | None"]


@dataclass(frozen=True, slots=True)
class Derivation:
    """``run(ctx, work)`` fills ``provides`` (NodeWork fields) from the node, the request and ``needs``;
    ``request_reads`` / ``node_reads`` name what it reads of the request and the node
    (:mod:`app.placement.reads`)."""

    name: str
    provides: tuple[str, ...]
    needs: tuple[str, ...]
    run: Step
    request_reads: tuple[str, ...] = ()
    node_reads: tuple[str, ...] = ()


def matches(ctx: PlanContext, work: NodeWork) -> None:
    """Fill ``work.classes`` and ``work.match_masks`` (one entry per device request)."""
    topology = work.topology
    if topology is None:
        return None
    classes = topology.classes
    found: list = []
    masks: list[int] = []
    for i, device in enumerate(ctx.devices):
        ct = classes.get(device.device_class)
        found.append(ct)
        token = ctx.selector_tokens[i]
        if ct is None:
            masks.append(0)
            continue
        if not token:
            masks.append(ct.full_mask)
            continue
        key = (device.device_class, token)
        mask = topology.selector_masks.get(key)
        if mask is None:
            inventory = work.node.inventory
            atoms = {a.id: a for a in inventory.atoms}
            mask = 0
            for j, atom_id in enumerate(ct.atom_ids):
                if selector_matches(device.selector, atoms[atom_id], inventory):
                    mask |= 1 << j
            topology.selector_masks[key] = mask
        masks.append(mask)
    work.classes = found
    work.match_masks = masks
    return None


def free(ctx: PlanContext, work: NodeWork) -> None:
    """Fill ``work.available_masks`` (free atoms of the class) and ``work.free_masks`` (free and
    matching), from ``state.unavailable`` and ``state.booked``."""
    if not ctx.devices:
        return None
    state = work.node.state
    unavailable, booked = state.unavailable, state.booked
    available_masks: list[int] = []
    free_masks: list[int] = []
    for i, ct in enumerate(work.classes):
        if ct is None:
            available = 0
        elif not unavailable and not booked:
            available = ct.full_mask
        else:
            available = ct.full_mask
            for atom_id, j in ct.index.items():
                if atom_id in unavailable or atom_id in booked:
                    available &= ~(1 << j)
        available_masks.append(available)
        free_masks.append(available & work.match_masks[i])
    work.available_masks = available_masks
    work.free_masks = free_masks
    return None


DERIVATIONS: tuple[Derivation, ...] = (
    Derivation(
        "matches",
        ("classes", "match_masks"),
        (),
        matches,
        request_reads=("devices", "devices.device_class", "devices.selector"),
        node_reads=("inventory.atoms", "inventory.labels", "inventory.label_sources"),  # selectors see labels
    ),
    Derivation(
        "free",
        ("available_masks", "free_masks"),
        ("classes", "match_masks"),
        free,
        request_reads=("devices",),
        node_reads=("state.unavailable", "state.booked"),
    ),
)
DERIVED_FIELDS: frozenset[str] = frozenset(f for d in DERIVATIONS for f in d.provides)


@cache
def derivations_for(fields: tuple[str, ...]) -> tuple[Derivation, ...]:
    """The derivations that provide ``fields`` and what those need, in ``DERIVATIONS`` order (memoized:
    the answer depends on the declarations only)."""
    wanted = set(fields)
    chosen: set[str] = set()
    for d in reversed(DERIVATIONS):  # a derivation only needs earlier ones
        if wanted & set(d.provides):
            chosen.add(d.name)
            wanted |= set(d.needs)
    return tuple(d for d in DERIVATIONS if d.name in chosen)
