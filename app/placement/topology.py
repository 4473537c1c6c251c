"""Link ranks and the default atom pick (docs/placement-rules.md, "Atom pick and NVLink").

Links are ranked as nvidia-smi topo prints them: NV (any ``NV#``) > PIX > PXB > PHB > NODE > SYS, and an
unknown link (no row in ``capacity_device_links``) ranks below SYS. MIG slices of one GPU are NV to each
other; otherwise a MIG slice's link is its parent GPU's link. The legacy ``SOC`` spelling is SYS.

The greedy pick grows a set from every free seed atom, each step adding the atom whose worst link to the
set is best (same NUMA node as the seed breaking ties, then the lower index), and keeps the set with the
best worst link, then the smallest NUMA spread, then the smallest sorted tuple of atom ids. Atoms of a
class are indexed in atom-id order, so index order is id order and the pick is deterministic.

The pick costs 30-500 µs per node in plain Python, and most nodes of a pool are alike, so it is memoized
by (link-matrix + NUMA signature, free-atom mask, count): a pool of identical hosts then costs a
dictionary lookup per node (docs/scaling.md). The per-node link matrices are
themselves cached per :class:`NodeInventory` object, which the I/O half keeps per pool and inventory
version. Both caches are bounded and hold only derived, immutable data, so the pick stays a pure
function of its inputs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import count as _counter

from app.placement.model import Atom, NodeInventory

UNKNOWN, SYS, NODE, PHB, PXB, PIX, NV = range(7)
LINK_NAMES = {NV: "NV", PIX: "PIX", PXB: "PXB", PHB: "PHB", NODE: "NODE", SYS: "SYS", UNKNOWN: "unknown"}
_TEXT_RANKS = {"PIX": PIX, "PXB": PXB, "PHB": PHB, "NODE": NODE, "SYS": SYS, "SOC": SYS}

_MAX_CACHED_NODES = 200_000
_MAX_CACHED_PICKS = 500_000


def link_rank(text: str | None) -> int:
    """Rank of an nvidia-smi link text: ``NV12`` -> NV (6), ``PIX`` 5, ``PXB`` 4, ``PHB`` 3, ``NODE`` 2,
    ``SYS``/``SOC`` 1, anything else or ``None`` -> UNKNOWN (0)."""
    if not text:
        return UNKNOWN
    t = text.strip().upper()
    if t.startswith("NV") and (len(t) == 2 or t[2:].isdigit()):
        return NV
    return _TEXT_RANKS.get(t, UNKNOWN)


def atom_link(a: Atom, b: Atom, links: Mapping[tuple[str, str], str]) -> int:
    """The rank of the link between atoms ``a`` and ``b``: a direct row first, then (for MIG slices) the
    parents' row; two slices of one GPU (or a slice and its GPU) are NV."""
    text = links.get((a.id, b.id)) or links.get((b.id, a.id))
    if text:
        return link_rank(text)
    pa, pb = a.parent or a.id, b.parent or b.id
    if pa == pb:
        return NV
    return link_rank(links.get((pa, pb)) or links.get((pb, pa)))


@dataclass(frozen=True, slots=True, eq=False)
class ClassTopology:
    """The atoms of one class on one node, in id order, with their link-rank matrix and NUMA nodes.

    ``signature`` is an interned integer for ``(ranks, numa)``: nodes with the same signature get the
    same pick for the same free mask and count. ``full_mask`` has one bit per atom."""

    device_class: str
    atom_ids: tuple[str, ...]
    index: Mapping[str, int]
    ranks: tuple[tuple[int, ...], ...]
    numa: tuple[int | None, ...]
    signature: int
    full_mask: int


@dataclass(slots=True, eq=False)
class NodeTopology:
    """Per-inventory derived data: class topologies and the selector match masks computed so far
    (keyed by ``(class, selector token)``)."""

    inventory: NodeInventory
    classes: dict[str, ClassTopology]
    selector_masks: dict[tuple[str, int], int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Pick:
    """A picked set: ``indices`` (sorted, into ``ClassTopology.atom_ids``), its ``worst_link`` rank (NV
    for one atom) and ``numa_spread`` (distinct NUMA nodes). The scorers score it
    (``app/placement/scorers/topology.py``, ``numa.py``)."""

    indices: tuple[int, ...]
    worst_link: int
    numa_spread: int


_signatures: dict[tuple[tuple[tuple[int, ...], ...], tuple[int | None, ...]], int] = {}
_node_cache: dict[int, NodeTopology] = {}
_picks: dict[tuple[int, int, int], Pick] = {}
_rank_of_text: dict[str, int] = {}
_next_signature = _counter(1)  # never reused, so clearing a cache cannot alias two signatures


def _intern(ranks: tuple[tuple[int, ...], ...], numa: tuple[int | None, ...]) -> int:
    key = (ranks, numa)
    found = _signatures.get(key)
    if found is None:
        if len(_signatures) >= _MAX_CACHED_PICKS:
            _signatures.clear()
        found = _signatures[key] = next(_next_signature)
    return found


def class_topology(
    device_class: str, atoms: list[Atom], links: Mapping[tuple[str, str], str]
) -> ClassTopology:
    """Build the :class:`ClassTopology` of ``atoms`` (all of ``device_class``), sorting them by id.

    Reads each link row once (the cold path of a pool: about 10 µs for an 8-GPU node); pairs without a
    row fall back to :func:`atom_link` only when a MIG parent can supply the link."""
    atoms = sorted(atoms, key=lambda a: a.id)
    n = len(atoms)
    ids = tuple(a.id for a in atoms)
    index = {a: i for i, a in enumerate(ids)}
    rows = [[UNKNOWN] * n for _ in range(n)]
    for i in range(n):
        rows[i][i] = NV
    rank_of = _rank_of_text
    for (a, b), text in links.items():
        i = index.get(a)
        if i is None:
            continue
        j = index.get(b)
        if j is None:
            continue
        rank = rank_of.get(text)
        if rank is None:
            if len(rank_of) > 10_000:
                rank_of.clear()
            rank = rank_of[text] = link_rank(text)
        rows[i][j] = rows[j][i] = rank
    if any(a.parent for a in atoms):
        for i in range(n):
            for j in range(i + 1, n):
                if rows[i][j] == UNKNOWN:
                    rows[i][j] = rows[j][i] = atom_link(atoms[i], atoms[j], links)
    ranks = tuple(tuple(row) for row in rows)
    numa = tuple(a.numa_node for a in atoms)
    return ClassTopology(
        device_class=device_class,
        atom_ids=ids,
        index=index,
        ranks=ranks,
        numa=numa,
        signature=_intern(ranks, numa),
        full_mask=(1 << n) - 1,
    )


def node_topology(inventory: NodeInventory) -> NodeTopology:
    """The cached :class:`NodeTopology` of ``inventory`` (computed on first use per inventory object)."""
    cached = _node_cache.get(id(inventory))
    if cached is not None and cached.inventory is inventory:
        return cached
    by_class: dict[str, list[Atom]] = {}
    for atom in inventory.atoms:
        by_class.setdefault(atom.device_class, []).append(atom)
    topo = NodeTopology(
        inventory=inventory,
        classes={c: class_topology(c, atoms, inventory.links) for c, atoms in by_class.items()},
    )
    if len(_node_cache) >= _MAX_CACHED_NODES:
        _node_cache.clear()
    _node_cache[id(inventory)] = topo
    return topo


def _picked(indices: tuple[int, ...], worst: int, numa: tuple[int | None, ...]) -> Pick:
    return Pick(indices, worst, len({numa[i] for i in indices}) if indices else 0)


def greedy_pick(
    ranks: tuple[tuple[int, ...], ...], numa: tuple[int | None, ...], free: list[int], count: int
) -> Pick:
    """The seed's greedy pick of ``count`` atoms among ``free`` indices (uncached; see :func:`pick`).

    From every seed: repeatedly add the candidate maximizing (worst link to the set, same NUMA node as
    the seed, lower index). Keep the set minimizing (-worst link, NUMA spread, sorted indices)."""
    if count <= 0:
        return _picked((), NV, numa)
    if count >= len(free):
        chosen = tuple(free)
        worst = min((ranks[a][b] for a in chosen for b in chosen if a < b), default=NV)
        return _picked(chosen, worst, numa)
    best_key: tuple[int, int, tuple[int, ...]] | None = None
    for indices, worst in _grown_sets(ranks, numa, free, count):
        key = (-worst, len({numa[i] for i in indices}), indices)
        if best_key is None or key < best_key:
            best_key = key
    assert best_key is not None
    return _picked(best_key[2], -best_key[0], numa)


def _grown_sets(
    ranks: tuple[tuple[int, ...], ...], numa: tuple[int | None, ...], free: list[int], count: int
) -> Iterator[tuple[tuple[int, ...], int]]:
    """The seed's growth from every seed atom: repeatedly add the candidate maximizing (worst link to the
    set, same NUMA node as the seed, lower index). Yields (sorted indices, worst link) per seed."""
    for seed in free:
        seed_numa = numa[seed]
        to_set = {c: ranks[c][seed] for c in free if c != seed}
        chosen = [seed]
        worst = NV
        while len(chosen) < count:
            nxt = max(to_set, key=lambda c: (to_set[c], numa[c] == seed_numa, -c))
            worst = min(worst, to_set.pop(nxt))
            chosen.append(nxt)
            row = ranks[nxt]
            for c in to_set:
                if row[c] < to_set[c]:
                    to_set[c] = row[c]
        yield tuple(sorted(chosen)), worst


def pick(topology: ClassTopology, free_mask: int, count: int) -> Pick:
    """The default pick of ``count`` atoms among the atoms set in ``free_mask`` (bit i = atom_ids[i]),
    memoized by (signature, free_mask, count). The caller guarantees ``count <= popcount(free_mask)``."""
    key = (topology.signature, free_mask, count)
    found = _picks.get(key)
    if found is None:
        free = [i for i in range(len(topology.atom_ids)) if free_mask >> i & 1]
        found = greedy_pick(topology.ranks, topology.numa, free, count)
        if len(_picks) >= _MAX_CACHED_PICKS:
            _picks.clear()
        _picks[key] = found
    return found


_tied: dict[tuple[int, int, int], tuple[tuple[int, ...], ...]] = {}


def tied_picks(topology: ClassTopology, free_mask: int, count: int) -> tuple[tuple[int, ...], ...]:
    """Every set the greedy pick could keep with the same (worst link, NUMA spread) as :func:`pick`'s
    choice, sorted (the first is :func:`pick`'s). The seed ranks sets by those two keys only; which of
    the tied sets a placement takes is free, and a seeded choice among them keeps two concurrent
    placements on one node from reaching for the same atoms. Memoized like :func:`pick`."""
    key = (topology.signature, free_mask, count)
    found = _tied.get(key)
    if found is not None:
        return found
    best = pick(topology, free_mask, count)
    free = [i for i in range(len(topology.atom_ids)) if free_mask >> i & 1]
    if count <= 1:
        sets = {(i,) for i in free if _picked((i,), NV, topology.numa).numa_spread == best.numa_spread}
    elif count >= len(free):
        sets = {best.indices}
    else:
        numa = topology.numa
        sets = {
            indices
            for indices, worst in _grown_sets(topology.ranks, numa, free, count)
            if worst == best.worst_link and len({numa[i] for i in indices}) == best.numa_spread
        }
    found = tuple(sorted(sets | {best.indices}, key=lambda t: (t != best.indices, t)))
    if len(_tied) >= _MAX_CACHED_PICKS:
        _tied.clear()
    _tied[key] = found
    return found


def worst_link_of(topology: ClassTopology, indices: list[int] | tuple[int, ...]) -> int:
    """The worst link rank among ``indices`` (NV for fewer than two atoms)."""
    ranks = topology.ranks
    return min((ranks[a][b] for a in indices for b in indices if a < b), default=NV)


def scored_set(topology: ClassTopology, indices: tuple[int, ...]) -> Pick:
    """A :class:`Pick` for a set chosen elsewhere (a plugin picker)."""
    ordered = tuple(sorted(indices))
    return _picked(ordered, worst_link_of(topology, ordered), topology.numa)
