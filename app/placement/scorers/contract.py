"""The scorer contract (docs/reasons.md; issue 16): a scorer declares what its score depends on, and
everything else that must agree with it is derived from that declaration, never written a second time.

A scorer is a module with ``NAME`` (its id, also the weight's key), ``DEFAULT_WEIGHT``, ``DEPENDS`` (one
of the three kinds below) and the function that kind names:

- ``COUNTS``: ``share(total_class_atoms, busy_before, requested) -> float`` in 0..1 for one device
  request, where ``total_class_atoms`` is the node's atoms of the requested class (selector aside) and
  ``busy_before`` those not free for the window. It is asked only for a node with atoms of the class:
  a node without any scores 0.0 here, in every ``COUNTS`` scorer (:func:`counts_share`). The score is
  the mean over device requests (0.0 for a request without devices). These scorers form the
  shortlist's ranking key (:meth:`ScorerSet.count_score_many`, mirrored by ``app/placement/shortlist.py``).
- ``PICK``: ``share(pick: Pick) -> float`` in 0..1, reading only the :class:`~app.placement.topology.Pick`
  (indices, worst link, NUMA spread); optionally ``ceiling(topology: ClassTopology, count) -> float``,
  an upper bound of ``share`` over every pick of ``count`` atoms of that class (used on hosts too big to
  try every subset; without it the bound is 1.0). The score is the mean over device requests of the
  share of their pick (1.0 without devices). The shortlist bounds these through
  :func:`app.placement.bounds.pick_score_ceiling`.
- ``NODE``: ``score(ctx, work) -> float`` in 0..1, free to read anything of the node (as plugin scorers
  do). Alike nodes do not share its score, and the shortlist does not apply while one is registered.

What is derived (so a new scorer touches its own module and the registry tuple only): the default
weights (:attr:`ScorerSet.default_weights`), the count-only ranking key, the bound on the rest, whether
and on what alike nodes share scores (:meth:`ScorerSet.share_key`), and the per-node score itself.
:func:`declare` raises :class:`ScorerDeclarationError` for a module that lacks a declaration.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.placement.context import NodeWork, PlanContext
    from app.placement.topology import ClassTopology

COUNTS = "counts"
PICK = "pick"
NODE = "node"
KINDS = (COUNTS, PICK, NODE)
# what a kind's score reads of NodeWork (app.placement.derived, or the picker filter's pick)
READS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        COUNTS: ("classes", "available_masks"),
        PICK: ("picks",),
        NODE: ("classes", "match_masks", "available_masks", "free_masks", "picks", "atoms"),
    }
)
# what a kind's score reads of the request (app.placement.reads): the COUNTS share takes each device
# request's count, the PICK share the pick alone; a NODE scorer declares its own REQUEST_READS (none
# declared: None, it reads anything, and the per-node memo is off while it is registered)
REQUEST_READS: Mapping[str, tuple[str, ...] | None] = MappingProxyType(
    {COUNTS: ("devices", "devices.count"), PICK: (), NODE: None}
)
ScoreFn = Callable[["PlanContext", "NodeWork"], float]


class ScorerDeclarationError(TypeError):
    """A scorer module misses ``NAME``, ``DEFAULT_WEIGHT``, ``DEPENDS`` or the function its kind needs."""


@dataclass(frozen=True, slots=True)
class Scorer:
    """One declared scorer: ``depends`` is ``COUNTS``, ``PICK`` or ``NODE``; ``share`` is the kind's
    function (``score(ctx, work)`` for ``NODE``); ``ceiling`` only for ``PICK`` (may be None)."""

    name: str
    default_weight: float
    depends: str
    share: Callable[..., float]
    ceiling: Callable[[ClassTopology, int], float] | None = None
    request_reads: tuple[str, ...] | None = ()  # None: undeclared (docs/extending.md, "What a filter reads")

    def score_fn(self) -> ScoreFn:
        """``score(ctx, work) -> float`` as the pipeline calls it, derived from the declaration (built
        once per scorer)."""
        found = _score_fns.get(self)
        if found is None:
            found = _score_fns[self] = self._build_score_fn()
        return found

    def _build_score_fn(self) -> ScoreFn:
        share = self.share
        if self.depends == NODE:
            return share
        if self.depends == COUNTS:

            def counts_score(ctx: PlanContext, work: NodeWork) -> float:
                devices = ctx.devices
                if not devices:
                    return 0.0
                total = 0.0
                classes, available = work.classes, work.available_masks
                for i, device in enumerate(devices):
                    ct = classes[i]
                    n = len(ct.atom_ids) if ct is not None else 0
                    total += counts_share(share, n, n - available[i].bit_count(), device.count)
                return total / len(devices)

            return counts_score

        def pick_score(ctx: PlanContext, work: NodeWork) -> float:
            picks = work.picks
            if not picks:
                return 1.0
            if len(picks) == 1:
                return share(picks[0])
            return sum(share(p) for p in picks) / len(picks)

        return pick_score


_score_fns: dict[Scorer, ScoreFn] = {}


def counts_share(
    share: Callable[[int, int, int], float], total: int, busy_before: int, requested: int
) -> float:
    """A ``COUNTS`` ``share`` for one device request; 0.0 for a node without atoms of the class (``share``
    is never asked about one)."""
    return share(total, busy_before, requested) if total > 0 else 0.0


def declare(module: ModuleType | Any) -> Scorer:
    """The :class:`Scorer` a module declares; :class:`ScorerDeclarationError` naming what is missing."""
    label = getattr(module, "__name__", repr(module))
    missing = [attr for attr in ("NAME", "DEFAULT_WEIGHT", "DEPENDS") if not hasattr(module, attr)]
    if missing:
        raise ScorerDeclarationError(f"scorer {label} declares no {', '.join(missing)}")
    depends = module.DEPENDS
    if depends not in KINDS:
        raise ScorerDeclarationError(f"scorer {label}: DEPENDS is {depends!r}, want one of {KINDS}")
    attr = "score" if depends == NODE else "share"
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ScorerDeclarationError(f"scorer {label} (DEPENDS = {depends}) has no {attr}() function")
    ceiling = getattr(module, "ceiling", None) if depends == PICK else None
    request_reads = REQUEST_READS[depends]
    if depends == NODE:
        declared = getattr(module, "REQUEST_READS", None)
        request_reads = None if declared is None else tuple(declared)
    return Scorer(str(module.NAME), float(module.DEFAULT_WEIGHT), depends, fn, ceiling, request_reads)


@dataclass(frozen=True, slots=True)
class ScorerSet:
    """The registered scorers, in order, and what is derived from their declarations."""

    scorers: tuple[Scorer, ...]

    @classmethod
    def of(cls, *modules: ModuleType | Any) -> ScorerSet:
        """Declare ``modules`` (in order); names must be unique."""
        return cls(tuple(declare(m) for m in modules))._checked()

    def adding(self, *modules: ModuleType | Any) -> ScorerSet:
        """This set plus ``modules`` (declared), after the existing scorers."""
        return ScorerSet(self.scorers + tuple(declare(m) for m in modules))._checked()

    def _checked(self) -> ScorerSet:
        names = [s.name for s in self.scorers]
        if len(set(names)) != len(names):
            raise ScorerDeclarationError(f"scorer names repeat: {names}")
        return self

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.scorers)

    @property
    def default_weights(self) -> Mapping[str, float]:
        """Scorer id -> its declared default weight (read-only)."""
        return MappingProxyType({s.name: s.default_weight for s in self.scorers})

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(s.depends for s in self.scorers)

    @property
    def reads(self) -> tuple[str, ...]:
        """The NodeWork fields the scores read (the registry derives them before scoring)."""
        return tuple(dict.fromkeys(f for s in self.scorers for f in READS[s.depends]))

    @property
    def request_reads(self) -> tuple[str, ...] | None:
        """The request fields the scores read (:mod:`app.placement.reads`), None when a scorer's are
        undeclared."""
        fields: set[str] = set()
        for s in self.scorers:
            if s.request_reads is None:
                return None
            fields.update(s.request_reads)
        return tuple(sorted(fields))

    def of_kind(self, kind: str) -> tuple[Scorer, ...]:
        return tuple(s for s in self.scorers if s.depends == kind)

    def weight(self, scorer: Scorer, overrides: Mapping[str, float]) -> float:
        """``overrides[scorer.name]`` if given, else the declared default."""
        return float(overrides.get(scorer.name, scorer.default_weight))

    def count_score_many(
        self, parts: Sequence[tuple[int, int, int]], overrides: Mapping[str, float] = MappingProxyType({})
    ) -> float:
        """The ``COUNTS`` scorers' weighted total for the device requests ``parts`` of
        ``(total_class_atoms, busy_before, requested)``: each scorer's share averaged over ``parts``
        (0.0 without parts), times its weight (``overrides`` by name, else the default)."""
        if not parts:
            return 0.0
        total = 0.0
        for s in self.of_kind(COUNTS):
            mean = sum(counts_share(s.share, t, busy, r) for t, busy, r in parts) / len(parts)
            total += self.weight(s, overrides) * mean
        return total

    def share_key(self, n_devices: int, plugin_pickers: bool) -> Callable[[NodeWork], tuple] | None:
        """The key under which alike nodes share their built-in scores, derived from the kinds: a
        ``COUNTS`` score is a function of (class signature, free-of-class mask), a ``PICK`` score of
        (class signature, free-and-matching mask) under the default picker, per device request. None
        (no sharing) when a ``NODE`` scorer is registered or a plugin picker chooses atoms."""
        kinds = self.kinds
        if NODE in kinds or plugin_pickers:
            return None
        if n_devices == 0:
            return lambda work: ()
        counts, picks = COUNTS in kinds, PICK in kinds
        if n_devices == 1:
            if counts and picks:
                return lambda w: (w.classes[0].signature, w.available_masks[0], w.free_masks[0])  # type: ignore[union-attr]
            if picks:
                return lambda w: (w.classes[0].signature, w.free_masks[0])  # type: ignore[union-attr]
            return lambda w: (w.classes[0].signature, w.available_masks[0])  # type: ignore[union-attr]

        def many(w: NodeWork) -> tuple:
            return tuple(
                (c.signature if c is not None else 0, a if counts else 0, f if picks else 0)
                for c, a, f in zip(w.classes, w.available_masks, w.free_masks, strict=True)
            )

        return many
