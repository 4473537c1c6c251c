"""Filter 8, ``picker``: choose the atoms. A scheduler plugin's ``preferAllocation`` for the class wins
and must return exactly ``count`` distinct free candidates (and an NVLink-complete set for nvlink-all);
otherwise the default greedy pick. Reason: ``picker <plugin-id>: <why>``.

Several device requests of one class on a node never share atoms: each pick removes its atoms from the
next request's free set (and a request left short is rejected with the ``fits`` reason).
"""

from __future__ import annotations

from collections.abc import Sequence

from app.placement.context import NodeWork, PlanContext
from app.placement.filters import fits
from app.placement.model import NVLINK_ALL
from app.placement.topology import NV, Pick, pick, scored_set

NAME = "picker"
# what it reads of the request and the node (docs/extending.md, "What a filter reads")
REQUEST_READS: tuple[str, ...] = ("devices", "devices.device_class", "devices.count", "devices.topology")
NODE_READS: tuple[str, ...] = ()
READS = ("classes", "match_masks", "free_masks")
AFTER = ("fits",)  # the pick needs count <= free atoms
WRITES = ("picks", "atoms")  # the pick: what scorers and the candidate read


def applies(ctx: PlanContext) -> bool:
    return bool(ctx.devices)


def wrong_pick(chosen: Sequence[str], candidates: Sequence[str], count: int) -> str | None:
    """Why a plugin's pick is unusable, or ``None``: not exactly ``count``, a repeat, or not free."""
    if len(chosen) != count:
        return f"returned {len(chosen)} atoms, want {count}"
    if len(set(chosen)) != len(chosen):
        return "returned an atom twice"
    allowed = set(candidates)
    for atom_id in chosen:
        if atom_id not in allowed:
            return f"returned {atom_id}, which is not a free candidate"
    return None


def check(ctx: PlanContext, work: NodeWork) -> str | None:
    """Fill ``work.picks`` and ``work.atoms`` for every device request."""
    n = len(ctx.devices)
    picks: list[Pick | None] = [None] * n
    atoms: list[tuple[str, ...]] = [()] * n
    taken: dict[str, int] = {}
    for i, device in enumerate(ctx.devices):
        ct = work.classes[i]
        assert ct is not None
        free = work.free_masks[i] & ~taken.get(device.device_class, 0)
        if free != work.free_masks[i] and free.bit_count() < device.count:
            total = work.match_masks[i].bit_count()
            return fits.reason(free.bit_count(), total, device.device_class)
        plugin_picker = ctx.pickers.get(device.device_class)
        if plugin_picker is not None:
            plugin_id, picker = plugin_picker
            candidates = [ct.atom_ids[j] for j in range(len(ct.atom_ids)) if free >> j & 1]
            chosen_ids = list(picker.prefer_allocation(ctx.request, device, work.node, candidates))
            why = wrong_pick(chosen_ids, candidates, device.count)
            if why is not None:
                return f"picker {plugin_id}: {why}"
            chosen = scored_set(ct, tuple(ct.index[a] for a in chosen_ids))
            if device.topology == NVLINK_ALL and device.count > 1 and chosen.worst_link != NV:
                return f"picker {plugin_id}: the {device.count} {device.device_class} are not NVLink-complete"
        else:
            chosen = pick(ct, free, device.count)
        picks[i] = chosen
        ids = ct.atom_ids
        atoms[i] = tuple(ids[j] for j in chosen.indices)
        mask = 0
        for j in chosen.indices:
            mask |= 1 << j
        taken[device.device_class] = taken.get(device.device_class, 0) | mask
    work.picks = picks
    work.atoms = atoms
    return None
