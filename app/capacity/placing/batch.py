"""Plan and commit a batch of one pool's reservations in one transaction (docs/placement-rules.md, "Two
placers"; docs/scaling.md): the pool-lease queue worker (:mod:`app.capacity.queue.worker`) and the bulk create
(:mod:`app.capacity.reservations.bulk`) both come here.

Steps, in the lock order pools -> nodes -> devices -> node_resources -> quota_usage (the inline
commit's, :mod:`app.db.locks`):

1. **read the pool row** (a plain read: the head the plans share): an archived pool (archived after the
   reservation was queued, or before) leaves every entry pending with ``the pool is archived``;
2. **plan** the entries one after another, oldest first, on reads they share
   (:class:`~app.capacity.planning.shared_reads.SharedReads`): the pool row read as their head, one
   exceptions read per group of window, resource names and tenant, each plan seeing the earlier plans
   of the attempt (their atoms booked and their scalar amounts held where the windows overlap) and
   what other plans of this process assumed meanwhile (their atoms are assumed booked in the
   :class:`~app.capacity.planning.snapshot.PoolCache`, which memoizes rankings per label set); what earlier
   attempts wrote is read back in this transaction. A queue worker's first attempt also plans on the
   pool's warm reads from its previous batch (``WarmSlot``,
   :class:`~app.capacity.planning.shared_reads.WarmReads`);
3. **lock the pool row** ``FOR SHARE`` right before the first commit (:class:`~app.db.locks.PoolShare`,
   docs/placement-rules.md, "The pipeline": the critical section is the commit alone, so inventory
   changes never wait for the plans): a pool archived since the read leaves every undecided entry
   pending with ``the pool is archived`` and nothing written, exactly as one archived before;
   **commit** the plans with the multi-row guarded commit
   (:func:`app.capacity.commit.multi_row.commit_rows`: a few statements for all the plans, fewer rows
   back for an entry = it lost the race, its rows deleted);
4. **replan** the losers without the lost node (or with it re-read, docs/placement-rules.md's rule in
   :mod:`app.capacity.placing.inline`), up to ``max_attempts``; then pending with ``Unschedulable after <n>
   conflicting attempts: ...``;
5. **preempt** (``BatchOptions.preemption``): a regular entry left pending because nothing fit is placed
   inline by preempting spot work (:func:`app.capacity.placing.preemption.place_preempting`), as a create
   would;
6. **charge** quota, last (:mod:`app.quota.batch_charge`): every tenant's rows locked once in sorted
   order, then all the placed entries in one guarded statement when they all fit, else each in a
   SAVEPOINT; a refusal (:class:`~app.errors.QuotaExceeded`) refuses that entry alone and removes what it
   booked. A pending entry is checked the same way and the check rolled back (a pending request holds
   nothing, but over quota is 409 even when nothing fits), so each entry answers what it alone would have
   answered.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from decimal import Decimal

from sqlalchemy.ext.asyncio import AsyncConnection

from app.answers.reservations import Condition
from app.capacity.commit.lost_races import LostRace, unschedulable_after
from app.capacity.commit.multi_row import PlannedRow, commit_rows, delete_allocations
from app.capacity.commit.shapes import QuotaCharge
from app.capacity.config import CapacityConfig
from app.capacity.placing import preemption
from app.capacity.placing.inline import EXCLUDING_KINDS, Pending, Placed, db_now, plan_seed
from app.capacity.planning.plan import plan_request
from app.capacity.planning.shared_reads import (
    WARM_SLACK,
    BatchPlanned,
    SharedReads,
    WarmReads,
    WarmSlot,
)
from app.capacity.planning.snapshot import PoolCache, PoolHead, read_pool_head
from app.db.locks import PoolShare
from app.errors import QuotaExceeded
from app.observability.metrics import LOST_RACES
from app.placement.model import Candidate, PlacementRequest, Plan, Rejections
from app.placement.options import SchedulerOptions
from app.placement.summary import ARCHIVED_POOL
from app.quota.batch_charge import UsageLocks, charge_one, charge_together, lock_usage


@dataclass
class BatchEntry:
    """One reservation of a batch (its row written and locked by the caller) and what became of it:
    ``outcome`` :class:`Placed` / :class:`Pending`, or ``refused`` (over quota, nothing kept)."""

    reservation_id: str
    request: PlacementRequest
    amounts: dict[str, Decimal]
    outcome: Placed | Pending | None = None
    refused: QuotaExceeded | None = None
    lost: list[LostRace] = field(default_factory=list)
    # a placed entry's conditions (a preemptor's Preempted condition); charged: its charge rode on its commit
    conditions: list[Condition] = field(default_factory=list)
    charged: bool = False

    @property
    def undecided(self) -> bool:
        """Neither placed, pending nor refused yet."""
        return self.outcome is None and self.refused is None


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """The scheduler options, attempts and shortlist floor of a batch (``CapacityConfig``'s);
    ``before_commit(attempt, candidates)`` runs between an attempt's plans and their commit (tests
    lose races on purpose there)."""

    options: SchedulerOptions
    max_attempts: int = 3
    shortlist_min: int = 48
    before_commit: Callable[[int, list[Candidate]], Awaitable[None]] | None = None
    # BC_CAPACITY_PREEMPTION: how a regular entry that nothing fit preempts spot work (None: it does not)
    preemption: preemption.PreemptOptions | None = None


def batch_options(config: CapacityConfig) -> BatchOptions:
    """The batch's options from the capacity config (preemption when ``BC_CAPACITY_PREEMPTION`` is on)."""
    how = preemption.PreemptOptions(config.options, config.max_attempts) if config.preemption else None
    return BatchOptions(config.options, config.max_attempts, config.shortlist_min, preemption=how)


@dataclass
class _Planned:
    entry: BatchEntry
    candidate: Candidate
    token: int


async def place_batch(
    conn: AsyncConnection,
    cache: PoolCache,
    opts: BatchOptions,
    pool_id: str,
    entries: list[BatchEntry],
    warm: WarmSlot | None = None,
) -> list[int]:
    """Decide every entry of ``pool_id`` in ``conn``'s transaction (steps 1-5 above); returns the cache
    assumption tokens of the committed atoms: forget them once the transaction has ended.

    ``warm``: the pool's :class:`~app.capacity.planning.shared_reads.WarmReads`
    from the caller's previous batch
    (the first attempt plans on them where still usable) and, on return, this batch's for the next
    one, left only when every entry was decided on the first attempt's plans (none lost a race, was
    refused quota or preempted); the caller clears it when the transaction does not commit."""
    carried = warm.reads if warm is not None else None
    if warm is not None:
        warm.reads = None  # mutated by this batch's plans: valid again only once it commits
    # the plans' head, a plain read: the pool row is locked FOR SHARE only right before the first commit
    head = await read_pool_head(conn, pool_id)
    if head.archived:
        for e in entries:
            if e.undecided:
                e.outcome = Pending(ARCHIVED_POOL)
    share = PoolShare(pool_id)
    tokens: list[int] = []
    usage = UsageLocks(warm.usage if warm is not None else set())
    first = await _plan_and_commit(
        conn, cache, opts, head, share, entries, tokens, first_attempt=1, warm=carried, keep=warm is not None
    )
    clean = first is not None and not any(e.lost for e in entries)
    if opts.preemption is not None:
        clean = await _preempt_pending(conn, cache, opts, share, entries) == 0 and clean
    # every tenant's rows at once, in (tenant, resource) order, before the placed entries are charged and
    # the pending ones checked: locking the pending tenants' rows only after the placed ones' would take
    # tenants out of order (a pending tenant sorting first) against another batch taking them in order
    if any(isinstance(e.outcome, Pending) for e in entries):
        decided = [e for e in entries if isinstance(e.outcome, (Placed, Pending))]
        await lock_usage(conn, [_charge(e) for e in decided], usage)
    if await _charge_placed(conn, cache, pool_id, entries, tokens, usage):
        clean = False
        # a refused entry's bookings were removed: the entries nothing fit get one more plan
        again = [e for e in entries if isinstance(e.outcome, Pending) and e.outcome.reason != ARCHIVED_POOL]
        for e in again:
            e.outcome, e.lost = None, []
        if again:
            await _plan_and_commit(conn, cache, opts, head, share, again, tokens, opts.max_attempts + 1)
            await _charge_placed(conn, cache, pool_id, again, tokens, usage)
    await _check_pending(conn, entries, usage)
    if warm is not None and clean and first is not None:
        warm.reads = first.warm()
    return tokens


async def _plan_and_commit(
    conn: AsyncConnection,
    cache: PoolCache,
    opts: BatchOptions,
    head: PoolHead,
    share: PoolShare,
    entries: list[BatchEntry],
    tokens: list[int],
    first_attempt: int,
    warm: WarmReads | None = None,
    keep: bool = False,
) -> SharedReads | None:
    """Steps 2-4: plan the undecided entries and commit them, replanning the losers, up to
    ``max_attempts`` (numbered from ``first_attempt``: the savepoints and the seeds); the committed
    atoms' assumption tokens are appended to ``tokens``. The first attempt plans on ``warm`` where
    usable, and with ``keep`` reads windows ``WARM_SLACK`` longer (for the batches after it); returns
    the first attempt's reads (None: nothing planned, or the pool archived). ``share``: the batch's
    pool lock, taken before the first commit (an archived pool there decides every undecided entry)."""
    pool_id = head.id
    first: SharedReads | None = None
    for attempt in range(first_attempt, first_attempt + opts.max_attempts):
        todo = [e for e in entries if e.undecided]
        if not todo:
            break
        requests = [e.request for e in todo]
        if attempt == first_attempt:
            shared = SharedReads(cache, head, requests, warm, WARM_SLACK if keep else timedelta(0))
        else:  # a replan reads afresh, exactly
            shared = SharedReads(cache, head, requests)
        if first is None:
            first = shared
        planned = await _plan_all(conn, cache, opts, todo, attempt, shared)
        if planned is None:  # the pool was archived (the plan's own read)
            for e in todo:
                e.outcome = Pending(ARCHIVED_POOL)
            return None
        if opts.before_commit is not None and planned:
            await opts.before_commit(attempt, [p.candidate for p in planned])
        # SELECT * FROM pools WHERE id = :pool FOR SHARE  -- once, right before the first commit
        if planned and not await share.take(conn):
            for p in planned:
                cache.forget(pool_id, p.token)
            for e in todo:
                e.outcome = Pending(ARCHIVED_POOL)
            return None
        rows = [PlannedRow(p.entry.reservation_id, p.entry.request, p.candidate) for p in planned]
        results = await commit_rows(conn, pool_id, rows, attempt)
        for p in planned:
            result = results[p.entry.reservation_id]
            if isinstance(result, LostRace):
                cache.forget(pool_id, p.token)
                LOST_RACES.labels(result.kind).inc()
                # (no FOR UPDATE of the lost node as inline does: this transaction holds the winners'
                # bookings, and waiting for a node lock now would invert the lock order)
                p.entry.lost.append(result)
            else:
                tokens.append(p.token)
                p.entry.outcome = Placed((result,), (p.token,))
    for e in entries:
        if e.undecided:  # every attempt lost a race
            e.outcome = Pending(unschedulable_after([r.reason for r in e.lost]))
    return first


async def _preempt_pending(
    conn: AsyncConnection, cache: PoolCache, opts: BatchOptions, share: PoolShare, entries: list[BatchEntry]
) -> int:
    """Each regular entry that nothing fit, placed by preempting spot work as an inline create would
    (issue 13: preemption always places inline), its charge riding on its guarded commit; returns how
    many entries tried. The pool lock (``share``) is taken first, outside the entries' savepoints (a
    rolled-back savepoint would drop a lock taken inside it); an archived pool leaves them pending with
    ``the pool is archived``."""
    candidates = [
        e
        for e in entries
        if isinstance(e.outcome, Pending)
        and e.outcome.reason != ARCHIVED_POOL
        and preemption.applies(True, e.request)
    ]
    if not candidates:
        return 0
    # SELECT * FROM pools WHERE id = :pool FOR SHARE  -- once; held already when something was committed
    if not await share.take(conn):
        for e in candidates:
            e.outcome = Pending(ARCHIVED_POOL)
        return len(candidates)
    now = await db_now(conn)
    for e in candidates:
        r = e.request
        assert r.start is not None and r.end is not None and opts.preemption is not None
        how = replace(opts.preemption, charge=_charge(e))
        savepoint = await conn.begin_nested()
        try:
            placed = await preemption.place_preempting(conn, cache, r, e.reservation_id, how, now, share)
        except QuotaExceeded as exc:
            await savepoint.rollback()
            e.outcome, e.refused = None, exc
            continue
        await savepoint.commit()
        if placed is not None:
            e.outcome, e.conditions, e.charged = placed.placed, [placed.condition], True
    return len(candidates)


async def _charge_placed(
    conn: AsyncConnection,
    cache: PoolCache,
    pool_id: str,
    entries: list[BatchEntry],
    tokens: list[int],
    usage: UsageLocks,
) -> bool:
    """Step 6 for the placed entries not charged yet (last in the lock order): each in a SAVEPOINT; a
    refusal refuses that entry alone and removes what it booked. True when any was refused."""
    placed = [e for e in entries if isinstance(e.outcome, Placed) and not e.charged]
    await lock_usage(conn, [_charge(e) for e in placed], usage)
    if await charge_together(conn, [_charge(e) for e in placed], keep=True):
        for e in placed:
            e.charged = True
        return False
    refused_any = False
    for e in sorted(placed, key=lambda e: (e.request.tenant_id, e.reservation_id)):
        assert isinstance(e.outcome, Placed)
        refused = await charge_one(conn, _charge(e), keep=True)
        e.charged = refused is None
        if refused is not None:
            refused_any = True
            await delete_allocations(conn, [a.allocation_id for a in e.outcome.allocations])
            for token in e.outcome.assumptions:
                cache.forget(pool_id, token)
                tokens.remove(token)
            e.outcome, e.refused = None, refused
    return refused_any


async def _check_pending(conn: AsyncConnection, entries: list[BatchEntry], usage: UsageLocks) -> None:
    """Step 6 for the pending entries: the charge checked and rolled back (a pending request holds
    nothing, but over quota is 409 even when nothing fits), beside what the batch placed."""
    pending = [e for e in entries if isinstance(e.outcome, Pending)]
    await lock_usage(conn, [_charge(e) for e in pending], usage)
    if await charge_together(conn, [_charge(e) for e in pending], keep=False):
        return
    for e in sorted(pending, key=lambda e: (e.request.tenant_id, e.reservation_id)):
        e.refused = await charge_one(conn, _charge(e), keep=False)
        if e.refused is not None:
            e.outcome = None


async def _plan_all(
    conn: AsyncConnection,
    cache: PoolCache,
    opts: BatchOptions,
    todo: list[BatchEntry],
    attempt: int,
    shared: SharedReads,
) -> list[_Planned] | None:
    """Plan ``todo`` one after another on reads they share
    (:class:`~app.capacity.planning.shared_reads.SharedReads`:
    one exceptions read per group of window, resource names and tenant, this attempt's earlier plans
    counted as booked and held where the windows overlap; earlier attempts' winners are read back from
    this transaction); each plan's atoms are also assumed booked in the cache for the other plans of
    this process. An entry that does not fit becomes pending; None when the pool turned out archived."""
    planned: list[_Planned] = []
    for e in todo:
        request = e.request
        assert request.start is not None and request.end is not None
        excluded = [r for r in e.lost if r.kind in EXCLUDING_KINDS]
        options = replace(
            opts.options,
            seed=plan_seed(e.reservation_id, attempt),
            excluded_nodes=opts.options.excluded_nodes | frozenset(r.node_id for r in excluded),
            exclusion_reasons={**opts.options.exclusion_reasons, **{r.node_id: r.reason for r in excluded}},
        )
        outcome = await plan_request(conn, cache, request, options, opts.shortlist_min, shared=shared)
        if outcome.head.archived:
            for p in planned:
                cache.forget(request.pool_id, p.token)
            return None
        plan = outcome.plan
        if isinstance(plan, Rejections):
            e.outcome = Pending(plan.summary, outcome.why_not(request, options))
            continue
        assert isinstance(plan, Plan) and len(plan.placements) == 1  # gangs place inline
        chosen = plan.chosen
        token = cache.assume(request.pool_id, chosen.node_id, chosen.booked_atoms, request.start, request.end)
        atoms = frozenset(chosen.atoms)
        shared.add(BatchPlanned(chosen.node_id, atoms, chosen.resources, request.start, request.end))
        planned.append(_Planned(e, chosen, token))
    return planned


def _charge(e: BatchEntry) -> QuotaCharge:
    """What ``e`` charges to its tenant's quota: its amounts over its window."""
    r = e.request
    assert r.start is not None and r.end is not None
    return QuotaCharge(r.tenant_id, r.pool_id, e.reservation_id, e.amounts, r.start, r.end)
