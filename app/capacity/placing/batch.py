"""Plan and commit a batch of one pool's reservations in one transaction (docs/placement-rules.md, "Two
placers";
docs/scaling.md): the pool-lease queue worker (:mod:`app.capacity.queue.worker`) and the bulk create
(:mod:`app.capacity.reservations.bulk`) both come here.

Steps, in the lock order pools -> nodes -> devices -> node_resources -> quota_usage (the inline
commit's, :mod:`app.db.locks`):

1. **read the pool row** (a plain read: the head the plans share): an archived pool (archived after the
   reservation was queued, or before) leaves every entry pending with ``the pool is archived``;
2. **plan** the entries one after another, oldest first, on reads they share
   (:class:`~app.capacity.planning.shared_reads.SharedReads`, issue 15): the pool row read as their head, one
   exceptions read per group of window, resource names and tenant, each plan seeing the earlier plans
   of the attempt (their atoms booked and their scalar amounts held where the windows overlap) and
   what other plans of this process assumed meanwhile (their atoms are assumed booked in the
   :class:`~app.capacity.planning.snapshot.PoolCache`, which memoizes rankings per label set); what earlier
   attempts wrote is read back in this transaction. A queue worker's first attempt also plans on the
   pool's warm reads from its previous batch (``WarmSlot``,
   :class:`~app.capacity.planning.shared_reads.WarmReads`);
3. **lock the pool row** ``FOR SHARE`` right before the first commit (:class:`~app.db.locks.PoolShare`,
   docs/placement-rules.md, "The pipeline": the critical section is the commit alone, so inventory
   changes never wait for the plans):
   a pool archived since the read leaves every undecided entry pending with ``the pool is archived``
   and nothing written, exactly as one archived before;
   **commit** the plans with guarded multi-row statements (:func:`_commit_plans`), compiled once: one
   statement locks the planned nodes per tenant, one the atoms, one writes the allocations, one the
   bookings (``ON CONFLICT DO NOTHING RETURNING``: fewer rows for an entry = it lost the race), one
   locks the ``node_resources`` rows and one holds the scalars, each window's holds on a (node,
   resource) guarded with their total (those that do not fit whole go one at a time,
   :func:`_hold_scalars`). A losing entry's rows are deleted; the others stay;
4. **replan** the losers without the lost node (or with it re-read, docs/placement-rules.md's rule in
   :mod:`app.capacity.placing.inline`), up to ``max_attempts``; then pending with ``Unschedulable after <n>
   conflicting attempts: ...``;
5. **preempt** (``BatchOptions.preemption``): a regular entry left pending because nothing fit is placed
   inline by preempting spot work (:func:`app.capacity.placing.preemption.place_preempting`), as a create
   would;
6. **charge** quota, last: every placed entry's tenant rows locked once in sorted order, then all the
   entries in one guarded statement when they all fit (:func:`_charge_together`), else each entry
   in a SAVEPOINT; a refusal (:class:`~app.errors.QuotaExceeded`) refuses that entry alone and removes
   what it booked. A pending entry is checked the same way and the check rolled back (a pending request
   holds nothing, but over quota is 409 even when nothing fits), so each entry answers what it alone
   would have answered.

A deadlock or exclusion violation inside a multi-row statement (40P01, 23P01: the same lost race) rolls
that attempt's commit back to its savepoint and commits the attempt's plans one by one with the
single-placement guarded commit (:func:`app.capacity.commit.single.commit_placements`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from decimal import Decimal
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.commit.lost_races import (
    ATOM_BOOKED,
    ATOM_UNHEALTHY,
    LOST_RACE_SQLSTATES,
    NOT_SCHEDULABLE,
    SCALAR_RAN_OUT,
    LostRace,
    atom_booked,
    atom_unhealthy,
    labels_hold,
    not_schedulable,
    scalar_ran_out,
    unschedulable_after,
)
from app.capacity.commit.shapes import Committed, QuotaCharge
from app.capacity.commit.single import commit_placements
from app.capacity.config import CapacityConfig
from app.capacity.placing import preemption
from app.capacity.placing.inline import (
    EXCLUDING_KINDS,
    Pending,
    Placed,
    db_now,
    plan_seed,
)
from app.capacity.planning.plan import plan_request
from app.capacity.planning.shared_reads import (
    WARM_SLACK,
    BatchPlanned,
    SharedReads,
    WarmReads,
    WarmSlot,
)
from app.capacity.planning.snapshot import PoolCache, PoolHead, read_pool_head
from app.capacity.predicates import schedulable_sql_within, tolerated_reasons
from app.db.locks import PoolShare
from app.db.prepared import Prepared
from app.db.tables import (
    TS,
    allocations,
    device_bookings,
    devices,
    node_labels,
    node_resources,
    nodes,
    pools,
    quota_usage,
    scalar_holdings,
)
from app.db.tx import sqlstate
from app.db.unnest import bound_rows
from app.db.windows import hold_if, holding_params, room_for, window
from app.errors import QuotaExceeded
from app.ids import new_id
from app.observability.metrics import LOST_RACES
from app.placement.model import Candidate, PlacementRequest, Plan, Rejections
from app.placement.options import SchedulerOptions
from app.placement.summary import ARCHIVED_POOL
from app.quota import charges as quota

_H = holding_params(scalar_holdings)
# INSERT INTO scalar_holdings (allocation_id, resource, node_id, pool_id, amount, starts_at, ends_at)
# SELECT :allocation_id, :resource, :node_id, :pool_id, :amount, :starts_at, :ends_at FROM node_resources nr
#  WHERE nr.node_id = :node_id AND nr.resource = :resource
#    AND (<peak of the node's :resource holdings over [:starts_at, :ends_at), app/db/windows.py>) + :amount
#        <= floor(nr.allocatable * nr.ratio)              -- windows.room_for: the sweep only if needed
# RETURNING allocation_id                                  -- no row: ran out
HOLD_SCALAR = hold_if(
    scalar_holdings,
    _H,
    node_resources.c.node_id == _H["node_id"],
    node_resources.c.resource == _H["resource"],
    room_for(
        scalar_holdings,
        [scalar_holdings.c.node_id == _H["node_id"], scalar_holdings.c.resource == _H["resource"]],
        _H["starts_at"],
        _H["ends_at"],
        _H["amount"],
        sa.func.floor(node_resources.c.allocatable * node_resources.c.ratio),
    ),
)


_NODES = sa.bindparam("node_ids", type_=pg.ARRAY(sa.Text))
_ATOM_IDS = sa.bindparam("atom_ids", type_=pg.ARRAY(sa.Text))
_TOLERATED = sa.bindparam("tolerated", type_=pg.ARRAY(sa.Text))  # predicates.tolerated_reasons(tenant)


TOLERATED_SEPARATOR = "\n"  # joins a tenant's tolerated reasons in one text (no reason holds a newline)
_TENANT_NODES = bound_rows(
    "w",
    ("node_id", _NODES, sa.Text),
    ("tenant_id", "tenant_ids", sa.Text),
    ("tolerated", "tolerated", sa.Text),
)


@cache
def lock_tenant_nodes_statement(skip_locked: bool) -> Prepared:
    """The batch's node guard for all its tenants at once, built and compiled once per variant::

    SELECT n.id, w.tenant_id FROM nodes n JOIN pools p ON p.id = n.pool_id
      JOIN unnest(:node_ids, :tenant_ids, :tolerated) AS w(node_id, tenant_id, tolerated) ON w.node_id = n.id
     WHERE n.pool_id = :pool_id
       AND <schedulable tolerating string_to_array(w.tolerated, E'\\n')>  -- schedulable_sql_within
     ORDER BY n.id FOR SHARE OF n [SKIP LOCKED]        -- a (node, tenant) missing: no longer schedulable
    """
    allowed = sa.func.string_to_array(_TENANT_NODES.c.tolerated, TOLERATED_SEPARATOR, type_=pg.ARRAY(sa.Text))
    return Prepared(
        sa.select(nodes.c.id, _TENANT_NODES.c.tenant_id)
        .select_from(
            nodes.join(pools, pools.c.id == nodes.c.pool_id).join(
                _TENANT_NODES, _TENANT_NODES.c.node_id == nodes.c.id
            )
        )
        .where(
            nodes.c.pool_id == sa.bindparam("pool_id", type_=sa.Text),
            schedulable_sql_within(allowed),
        )
        .order_by(nodes.c.id)
        .with_for_update(read=True, of=nodes, skip_locked=skip_locked)
    )


@cache
def lock_atoms_statement(skip_locked: bool) -> Prepared:
    """The batch's atom guard, built and compiled once per variant::

    SELECT id, class, node_id FROM devices WHERE id = ANY(:atom_ids) AND healthy AND bookable
     ORDER BY id FOR SHARE [SKIP LOCKED]                  -- an atom missing: unhealthy or unbookable
    """
    return Prepared(
        sa.select(devices.c.id, devices.c["class"], devices.c.node_id)
        .where(devices.c.id == sa.any_(_ATOM_IDS), devices.c.healthy, devices.c.bookable)
        .order_by(devices.c.id)
        .with_for_update(read=True, skip_locked=skip_locked)
    )


INSERT_ALLOCATION = sa.insert(allocations)
_ROWS = {
    name: sa.bindparam(name, type_=pg.ARRAY(t))
    for name, t in (("ids", sa.Text), ("node_ids", sa.Text), ("starts", TS), ("ends", TS))
}
_BOOKING_ROWS = bound_rows(
    "w",
    ("device_id", _ATOM_IDS, sa.Text),
    ("allocation_id", _ROWS["ids"], sa.Text),
    ("starts_at", _ROWS["starts"], TS),
    ("ends_at", _ROWS["ends"], TS),
)
# INSERT INTO device_bookings (device_pk, device_id, pool_id, allocation_id, during)
#   SELECT d.pk, d.id, :pool_id, w.allocation_id, tstzrange(w.starts_at, w.ends_at, '[)')
#     FROM devices d JOIN unnest(:atom_ids, :ids, :starts, :ends) AS w (device_id, allocation_id, starts_at,
#          ends_at) ON w.device_id = d.id
#   ON CONFLICT DO NOTHING RETURNING allocation_id      -- fewer rows for an allocation: booked meanwhile
INSERT_BOOKINGS = Prepared(
    pg_insert(device_bookings)
    .from_select(
        ["device_pk", "device_id", "pool_id", "allocation_id", "during"],
        sa.select(
            devices.c.pk,
            devices.c.id,
            sa.bindparam("pool_id", type_=sa.Text),
            _BOOKING_ROWS.c.allocation_id,
            sa.func.tstzrange(_BOOKING_ROWS.c.starts_at, _BOOKING_ROWS.c.ends_at, sa.literal_column("'[)'")),
        ).select_from(devices.join(_BOOKING_ROWS, _BOOKING_ROWS.c.device_id == devices.c.id)),
    )
    .on_conflict_do_nothing()
    .returning(device_bookings.c.allocation_id)
)


_SCALAR_KEYS = bound_rows("k", ("node_id", _ROWS["node_ids"], sa.Text), ("resource", "resources", sa.Text))


@cache
def lock_scalars_statement(skip_locked: bool) -> Prepared:
    """Every ``node_resources`` row a batch holds from, in one statement, in (node, resource) order::

    SELECT node_id, resource FROM node_resources
     WHERE (node_id, resource) IN (SELECT * FROM unnest(:node_ids, :resources) AS k(node_id, resource))
     ORDER BY node_id, resource FOR UPDATE [SKIP LOCKED]   -- a row missing: the resource ran out
    """
    return Prepared(
        sa.select(node_resources.c.node_id, node_resources.c.resource)
        .where(sa.tuple_(node_resources.c.node_id, node_resources.c.resource).in_(sa.select(_SCALAR_KEYS)))
        .order_by(node_resources.c.node_id, node_resources.c.resource)
        .with_for_update(skip_locked=skip_locked)
    )


_HOLDS = bound_rows(
    "w",
    ("allocation_id", _ROWS["ids"], sa.Text),
    ("resource", "resources", sa.Text),
    ("node_id", _ROWS["node_ids"], sa.Text),
    ("amount", "amounts", sa.Numeric),
    ("starts_at", _ROWS["starts"], TS),
    ("ends_at", _ROWS["ends"], TS),
    ("total", "totals", sa.Numeric),
)
# The holds of many allocations in one statement, one group per (node, resource) whose holds share one
# window, each row guarded with its group's total (the statement does not see its own rows):
# INSERT INTO scalar_holdings (allocation_id, resource, node_id, pool_id, amount, starts_at, ends_at)
# SELECT w.allocation_id, w.resource, w.node_id, :pool_id, w.amount, w.starts_at, w.ends_at
#   FROM unnest(:ids, :resources, :node_ids, :amounts, :starts, :ends, :totals)
#        AS w(allocation_id, resource, node_id, amount, starts_at, ends_at, total)
#   JOIN node_resources nr ON nr.node_id = w.node_id AND nr.resource = w.resource
#  WHERE (<peak of the node's w.resource holdings over [w.starts_at, w.ends_at)>) + w.total
#        <= floor(nr.allocatable * nr.ratio)          -- windows.room_for: the sweep only if needed
# RETURNING allocation_id, resource                   -- a group missing: it goes one hold at a time
HOLD_SCALARS = Prepared(
    sa.insert(scalar_holdings)
    .from_select(
        ["allocation_id", "resource", "node_id", "pool_id", "amount", "starts_at", "ends_at"],
        sa.select(
            _HOLDS.c.allocation_id,
            _HOLDS.c.resource,
            _HOLDS.c.node_id,
            sa.bindparam("pool_id", type_=sa.Text),
            _HOLDS.c.amount,
            _HOLDS.c.starts_at,
            _HOLDS.c.ends_at,
        )
        .select_from(
            _HOLDS.join(
                node_resources,
                sa.and_(
                    node_resources.c.node_id == _HOLDS.c.node_id,
                    node_resources.c.resource == _HOLDS.c.resource,
                ),
            )
        )
        .where(
            room_for(
                scalar_holdings,
                [
                    scalar_holdings.c.node_id == _HOLDS.c.node_id,
                    scalar_holdings.c.resource == _HOLDS.c.resource,
                ],
                _HOLDS.c.starts_at,
                _HOLDS.c.ends_at,
                _HOLDS.c.total,
                sa.func.floor(node_resources.c.allocatable * node_resources.c.ratio),
                (_HOLDS, node_resources),
            )
        ),
    )
    .returning(scalar_holdings.c.allocation_id, scalar_holdings.c.resource)
)


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
    conditions: list[dict[str, Any]] = field(default_factory=list)
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
    usage = _Usage(warm.usage if warm is not None else set())
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
        await _lock_batch_usage(conn, [e for e in entries if isinstance(e.outcome, (Placed, Pending))], usage)
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
        results = await _commit_plans(conn, pool_id, planned, attempt)
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
        charge = QuotaCharge(r.tenant_id, r.pool_id, e.reservation_id, e.amounts, r.start, r.end)
        how = replace(opts.preemption, charge=charge)
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


@dataclass
class _Usage:
    """The ``quota_usage`` rows of a batch: ``locked`` by this transaction already (outside any
    SAVEPOINT, so held to COMMIT), and ``known`` to exist (a worker's, kept across its batches of the
    pool: :attr:`WarmSlot.usage`), as ``(tenant, pool, resource)``."""

    known: set[tuple[str, str, str]] = field(default_factory=set)
    locked: set[tuple[str, str, str]] = field(default_factory=set)


_USAGE_KEYS = bound_rows("k", ("tenant_id", "tenant_ids", sa.Text), ("resource", "resources", sa.Text))
# SELECT tenant_id, resource FROM quota_usage
#  WHERE pool_id = :pool_id AND (tenant_id, resource) IN (SELECT * FROM unnest(:tenant_ids, :resources))
#  ORDER BY tenant_id COLLATE "C", resource COLLATE "C" FOR UPDATE  -- Python's sorted order, as one by one
LOCK_BATCH_USAGE = Prepared(
    sa.select(quota_usage.c.tenant_id, quota_usage.c.resource)
    .where(
        quota_usage.c.pool_id == sa.bindparam("pool_id", type_=sa.Text),
        sa.tuple_(quota_usage.c.tenant_id, quota_usage.c.resource).in_(sa.select(_USAGE_KEYS)),
    )
    .order_by(quota_usage.c.tenant_id.collate("C"), quota_usage.c.resource.collate("C"))
    .with_for_update()
)


async def _lock_batch_usage(
    conn: AsyncConnection, entries: list[BatchEntry], usage: _Usage | None = None
) -> None:
    """Lock every tenant's ``quota_usage`` rows for all the resources ``entries`` charge, tenants and
    resources in sorted order, as one charge locks them (:func:`app.quota.service.charge`): charging
    entry after entry would lock one tenant's rows in the entries' order (``gpu``, then ``cpu`` for a
    later entry) and deadlock against a single charge taking ``cpu`` before ``gpu``.

    With ``usage``: rows this transaction locked already are not locked again, and when every row
    left is known to exist, one statement locks them all (:data:`LOCK_BATCH_USAGE`); otherwise (a
    first charge of a tenant, or a row found missing) one tenant at a time, inserting missing rows."""
    usage = usage or _Usage()
    wanted = {
        (e.request.tenant_id, e.request.pool_id, r)
        for e in entries
        for r, n in e.amounts.items()
        if Decimal(n) > 0
    } - usage.locked
    if not wanted:
        return
    keys = sorted(wanted)
    if wanted <= usage.known and len({k[1] for k in keys}) == 1:
        params = {
            "pool_id": keys[0][1],
            "tenant_ids": [k[0] for k in keys],
            "resources": [k[2] for k in keys],
        }
        if len((await LOCK_BATCH_USAGE.run(conn, params)).all()) == len(keys):
            usage.locked |= wanted
            return
    by_tenant: dict[tuple[str, str], list[str]] = defaultdict(list)
    for tenant, pool, resource in keys:
        by_tenant[(tenant, pool)].append(resource)
    for (tenant, pool), resources in sorted(by_tenant.items()):
        await _lock_tenant_rows(conn, tenant, pool, resources)
    usage.locked |= wanted
    usage.known |= wanted


async def _charge_placed(
    conn: AsyncConnection,
    cache: PoolCache,
    pool_id: str,
    entries: list[BatchEntry],
    tokens: list[int],
    usage: _Usage | None = None,
) -> bool:
    """Step 6 for the placed entries not charged yet (last in the lock order): each in a SAVEPOINT; a
    refusal refuses that entry alone and removes what it booked. True when any was refused."""
    placed = [e for e in entries if isinstance(e.outcome, Placed) and not e.charged]
    await _lock_batch_usage(conn, placed, usage)
    if await _charge_together(conn, placed, keep=True):
        for e in placed:
            e.charged = True
        return False
    refused_any = False
    for e in sorted(placed, key=lambda e: (e.request.tenant_id, e.reservation_id)):
        assert isinstance(e.outcome, Placed)
        refused = await _charge_one(conn, e, keep=True)
        e.charged = refused is None
        if refused is not None:
            refused_any = True
            await _delete_lost(conn, [a.allocation_id for a in e.outcome.allocations])
            for token in e.outcome.assumptions:
                cache.forget(pool_id, token)
                tokens.remove(token)
            e.outcome, e.refused = None, refused
    return refused_any


async def _check_pending(
    conn: AsyncConnection, entries: list[BatchEntry], usage: _Usage | None = None
) -> None:
    """Step 6 for the pending entries: the charge checked and rolled back (a pending request holds
    nothing, but over quota is 409 even when nothing fits), beside what the batch placed."""
    pending = [e for e in entries if isinstance(e.outcome, Pending)]
    await _lock_batch_usage(conn, pending, usage)
    if await _charge_together(conn, pending, keep=False):
        return
    for e in sorted(pending, key=lambda e: (e.request.tenant_id, e.reservation_id)):
        e.refused = await _charge_one(conn, e, keep=False)
        if e.refused is not None:
            e.outcome = None


def _apart(keys: Iterable[tuple[Any, ...]]) -> bool:
    """Whether, per holder, the distinct windows of ``keys`` (``(*holder, start, end)``, each once) are
    pairwise apart: then one guard per (holder, window) with the window's total is exact, as no row of
    one window counts in another's peak. Sorted by start, windows are apart when each starts at or after
    the end of the one before."""
    by_holder: dict[tuple[Any, ...], list[tuple[Any, Any]]] = defaultdict(list)
    for *holder, start, end in keys:
        by_holder[tuple(holder)].append((start, end))
    for windows in by_holder.values():
        windows.sort()
        if any(later[0] < earlier[1] for earlier, later in zip(windows, windows[1:], strict=False)):
            return False
    return True


async def _charge_together(conn: AsyncConnection, entries: list[BatchEntry], keep: bool) -> bool:
    """Every entry's charge in one statement (``app.quota.service.HOLD_QUOTA_ROWS``) in a SAVEPOINT,
    their ``quota_usage`` rows locked already: True when all fit (kept, or with ``keep=False`` only
    checked and rolled back), which is what charging them one after another would have answered; False
    (rolled back, nothing changed) when one did not fit, or when one tenant charges one resource over
    windows that overlap without being equal (their guards would not see each other): the caller
    charges them one by one. Each row is guarded with the total of its (tenant, resource, window)."""
    rows = []
    totals: dict[tuple[str, str, Any, Any], Decimal] = defaultdict(Decimal)
    for e in entries:
        r = e.request
        for resource, n in sorted(e.amounts.items()):
            if Decimal(n) > 0:
                rows.append((e.reservation_id, r.tenant_id, resource, Decimal(n), r.start, r.end))
                totals[(r.tenant_id, resource, r.start, r.end)] += Decimal(n)
    if not rows:
        return True
    if not _apart(totals):
        return False
    columns = [list(c) for c in zip(*rows, strict=True)]
    names = ("reservation_ids", "tenant_ids", "resources", "amounts", "starts", "ends")
    params: dict[str, Any] = dict(zip(names, columns, strict=True))
    params["totals"] = [totals[(row[1], row[2], row[4], row[5])] for row in rows]
    params["pool_id"] = entries[0].request.pool_id
    savepoint = await conn.begin_nested()
    # <HOLD_QUOTA_ROWS>: one row per (reservation, resource), guarded with its group's total
    held = len((await quota.HOLD_QUOTA_ROWS.run(conn, params)).all())
    if held == len(rows) and keep:
        await savepoint.commit()
    else:
        await savepoint.rollback()
    return held == len(rows)


async def _charge_one(conn: AsyncConnection, e: BatchEntry, keep: bool) -> QuotaExceeded | None:
    """Charge ``e`` in a SAVEPOINT (``keep=False``: only check, and roll the charge back); the refusal."""
    assert e.request.start is not None and e.request.end is not None
    savepoint = await conn.begin_nested()
    try:
        await quota.charge(
            conn,
            e.request.tenant_id,
            e.request.pool_id,
            e.reservation_id,
            e.amounts,
            e.request.start,
            e.request.end,
        )
    except QuotaExceeded as exc:
        await savepoint.rollback()
        return exc
    if keep:
        await savepoint.commit()
    else:
        await savepoint.rollback()
    return None


async def _lock_tenant_rows(conn: AsyncConnection, tenant: str, pool_id: str, resources: list[str]) -> None:
    """Lock (creating them first when missing) the tenant's ``quota_usage`` rows of ``resources``, in
    resource order, to the end of the transaction."""
    if not resources:
        return
    # SELECT resource FROM quota_usage WHERE tenant_id = :t AND pool_id = :p AND resource = ANY(:rs)
    #  ORDER BY resource FOR UPDATE
    await quota.lock_usage_rows(conn, tenant, pool_id, resources)


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
            e.outcome = Pending(plan.summary)
            continue
        assert isinstance(plan, Plan) and len(plan.placements) == 1  # gangs place inline
        chosen = plan.chosen
        token = cache.assume(request.pool_id, chosen.node_id, chosen.booked_atoms, request.start, request.end)
        atoms = frozenset(chosen.atoms)
        shared.add(BatchPlanned(chosen.node_id, atoms, chosen.resources, request.start, request.end))
        planned.append(_Planned(e, chosen, token))
    return planned


# ------------------------------------------------------------------------------- the multi-row commit


async def _commit_plans(
    conn: AsyncConnection, pool_id: str, planned: list[_Planned], attempt: int
) -> dict[str, Committed | LostRace]:
    """Commit every plan of one attempt with multi-row guarded statements inside
    ``SAVEPOINT capacity_batch_<attempt>``; reservation id -> :class:`Committed` or :class:`LostRace`."""
    if not planned:
        return {}
    savepoint = f"capacity_batch_{int(attempt)}"
    await conn.exec_driver_sql(f"SAVEPOINT {savepoint}")
    try:
        results = await _guarded_rows(conn, pool_id, planned, skip_locked=attempt > 1)
    except DBAPIError as exc:
        if sqlstate(exc) not in LOST_RACE_SQLSTATES:
            raise
        await conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {savepoint}")
        await conn.exec_driver_sql(f"RELEASE SAVEPOINT {savepoint}")
        return await _commit_one_by_one(conn, planned, attempt)
    await conn.exec_driver_sql(f"RELEASE SAVEPOINT {savepoint}")
    return results


async def _commit_one_by_one(
    conn: AsyncConnection, planned: list[_Planned], attempt: int
) -> dict[str, Committed | LostRace]:
    """The fallback after a deadlock: each plan with the single-placement guarded commit."""
    out: dict[str, Committed | LostRace] = {}
    for p in planned:
        r = p.entry.request
        assert r.start is not None and r.end is not None
        result = await commit_placements(
            conn, r, (p.candidate,), p.entry.reservation_id, attempt, r.start, r.end
        )
        out[p.entry.reservation_id] = result if isinstance(result, LostRace) else result[0]
    return out


async def _guarded_rows(
    conn: AsyncConnection, pool_id: str, planned: list[_Planned], skip_locked: bool
) -> dict[str, Committed | LostRace]:
    """The multi-row commit. ``skip_locked`` (attempts after the first, when this transaction already
    holds the bookings of the batch's winners): a node, atom or ``node_resources`` row another
    transaction holds in a conflicting mode (or waits for) is not waited for but lost, so the
    transaction never waits for a lock while it holds bookings (that would invert the lock order)."""
    lost: dict[str, LostRace] = {}
    await _check_nodes(conn, pool_id, planned, lost, skip_locked)
    await _check_labels(conn, planned, lost)
    classes = await _check_atoms(conn, planned, lost, skip_locked)
    alive = [p for p in planned if p.entry.reservation_id not in lost]
    ids = {p.entry.reservation_id: new_id("alloc") for p in alive}
    await _insert_allocations(conn, pool_id, alive, ids)
    await _insert_bookings(conn, pool_id, alive, ids, lost)
    await _hold_scalars(conn, pool_id, alive, ids, lost, skip_locked)
    await _delete_lost(conn, [ids[r] for r in lost if r in ids])
    out: dict[str, Committed | LostRace] = dict(lost)
    for p in alive:
        rid = p.entry.reservation_id
        if rid not in lost:
            c = p.candidate
            out[rid] = Committed(ids[rid], c.node_id, tuple(c.atoms), dict(c.resources), classes.get(rid, {}))
    return out


async def _check_nodes(
    conn: AsyncConnection, pool_id: str, planned: list[_Planned], lost: dict[str, LostRace], skip_locked: bool
) -> None:
    """Lock the planned nodes that are still schedulable for their entries' tenants, every tenant's in
    one statement (:func:`lock_tenant_nodes_statement`); an entry whose (node, tenant) is not among
    them lost the race."""
    pairs = sorted({(p.candidate.node_id, p.entry.request.tenant_id) for p in planned})
    if not pairs:
        return
    params = {
        "node_ids": [n for n, _ in pairs],
        "tenant_ids": [t for _, t in pairs],
        "tolerated": [TOLERATED_SEPARATOR.join(tolerated_reasons(t)) for _, t in pairs],
        "pool_id": pool_id,
    }
    rows = (await lock_tenant_nodes_statement(skip_locked).run(conn, params)).all()
    still = {(r[0], r[1]) for r in rows}
    for p in planned:
        if (p.candidate.node_id, p.entry.request.tenant_id) not in still:
            lost[p.entry.reservation_id] = _lost(p, NOT_SCHEDULABLE)


async def _check_labels(conn: AsyncConnection, planned: list[_Planned], lost: dict[str, LostRace]) -> None:
    """The locked nodes' labels again, for the entries that ask for labels (one statement)."""
    asking = [p for p in planned if p.entry.request.node_labels and p.entry.reservation_id not in lost]
    if not asking:
        return
    keys = sorted({k for p in asking for k in p.entry.request.node_labels})
    # SELECT node_id, key, value, source FROM node_labels WHERE node_id = ANY(:nodes) AND key = ANY(:keys)
    have: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)
    for r in (
        await conn.execute(
            sa.select(
                node_labels.c.node_id, node_labels.c.key, node_labels.c.value, node_labels.c.source
            ).where(
                node_labels.c.node_id.in_(sorted({p.candidate.node_id for p in asking})),
                node_labels.c.key.in_(keys),
            )
        )
    ).all():
        have[r.node_id][r.key] = (r.value, r.source)
    for p in asking:
        if not labels_hold(p.entry.request.node_labels, have.get(p.candidate.node_id, {})):
            lost[p.entry.reservation_id] = _lost(p, NOT_SCHEDULABLE)


async def _check_atoms(
    conn: AsyncConnection, planned: list[_Planned], lost: dict[str, LostRace], skip_locked: bool
) -> dict[str, dict[str, Decimal]]:
    """Lock the picked atoms that are still healthy and bookable (one statement); returns reservation
    id -> atoms per device class for the entries whose atoms all are."""
    alive = [p for p in planned if p.entry.reservation_id not in lost and p.candidate.atoms]
    if not alive:
        return {}
    atom_ids = sorted({a for p in alive for a in p.candidate.atoms})
    rows = (await lock_atoms_statement(skip_locked).run(conn, {"atom_ids": atom_ids})).all()
    ok = {r[0]: (r[1], r[2]) for r in rows}
    classes: dict[str, dict[str, Decimal]] = {}
    for p in alive:
        found = [ok.get(a) for a in p.candidate.atoms]
        if any(f is None or f[1] != p.candidate.node_id for f in found):
            lost[p.entry.reservation_id] = _lost(p, ATOM_UNHEALTHY)
            continue
        counts: dict[str, Decimal] = defaultdict(Decimal)
        for f in found:
            assert f is not None
            counts[f[0]] += 1
        classes[p.entry.reservation_id] = dict(counts)
    return classes


async def _insert_allocations(
    conn: AsyncConnection, pool_id: str, alive: list[_Planned], ids: dict[str, str]
) -> None:
    """One multi-row INSERT of the allocations (the bookings and holdings refer to them)."""
    if not alive:
        return
    # INSERT INTO allocations (id, reservation_id, pool_id, node_id, atoms, resources, during)
    #   VALUES (:id, :reservation_id, ...)     -- one statement compiled once, the rows sent as one batch
    await conn.execute(
        INSERT_ALLOCATION,
        [
            {
                "id": ids[p.entry.reservation_id],
                "reservation_id": p.entry.reservation_id,
                "pool_id": pool_id,
                "node_id": p.candidate.node_id,
                "atoms": list(p.candidate.atoms),
                "resources": {k: str(v) for k, v in p.candidate.resources.items()},
                "during": _during(p),
            }
            for p in alive
        ],
    )


async def _insert_bookings(
    conn: AsyncConnection,
    pool_id: str,
    alive: list[_Planned],
    ids: dict[str, str],
    lost: dict[str, LostRace],
) -> None:
    """One multi-row INSERT of every atom's booking (a whole-node lease's held atoms too,
    ``Candidate.booked_atoms``); an entry with fewer rows back lost the race."""
    rows = [
        (atom, ids[p.entry.reservation_id], p.entry.request.start, p.entry.request.end)
        for p in alive
        if p.entry.reservation_id not in lost
        for atom in p.candidate.booked_atoms
    ]
    if not rows:
        return
    atom_ids, allocation_ids, starts, ends = (list(c) for c in zip(*rows, strict=True))
    params = {"atom_ids": atom_ids, "ids": allocation_ids, "starts": starts, "ends": ends, "pool_id": pool_id}
    # <INSERT_BOOKINGS>: ON CONFLICT DO NOTHING RETURNING allocation_id (fewer rows: booked meanwhile)
    booked: dict[str, int] = defaultdict(int)
    for (allocation_id,) in (await INSERT_BOOKINGS.run(conn, params)).all():
        booked[allocation_id] += 1
    for p in alive:
        rid = p.entry.reservation_id
        if rid not in lost and booked[ids[rid]] != len(p.candidate.booked_atoms):
            lost[rid] = _lost(p, ATOM_BOOKED)


async def _hold_scalars(
    conn: AsyncConnection,
    pool_id: str,
    alive: list[_Planned],
    ids: dict[str, str],
    lost: dict[str, LostRace],
    skip_locked: bool = False,
) -> None:
    """Each scalar of the surviving entries with the guarded hold of :mod:`app.capacity.commit.single`
    (``node_resources`` row lock, then the peak guard), in (node, resource) order:

    1. one statement locks every ``node_resources`` row (:func:`lock_scalars_statement`); an entry whose
       row is missing (or, skipping locked rows, held elsewhere) lost the race;
    2. one statement (:data:`HOLD_SCALARS`) holds every (node, resource) whose holds' windows are
       equal or apart, each row guarded with the total of its window: a window's holds fit whole or not
       at all;
    3. the (node, resource) pairs that did not fit whole, and those with windows that overlap in part,
       one hold at a time (:data:`HOLD_SCALAR`,
       under the locks of step 1), so each hold sees the earlier ones: the first that no longer fit
       lose."""
    holds = sorted(
        (p.candidate.node_id, resource, p.entry.reservation_id, Decimal(n), p)
        for p in alive
        if p.entry.reservation_id not in lost
        for resource, n in p.candidate.resources.items()
    )
    if not holds:
        return
    keys = sorted({(h[0], h[1]) for h in holds})
    params = {"node_ids": [k[0] for k in keys], "resources": [k[1] for k in keys]}
    # SELECT node_id, resource FROM node_resources WHERE (node_id, resource) IN (...)
    #  ORDER BY node_id, resource FOR UPDATE [SKIP LOCKED]
    locked = {(r[0], r[1]) for r in (await lock_scalars_statement(skip_locked).run(conn, params)).all()}
    groups: dict[tuple[str, str], list[tuple[str, Decimal, _Planned]]] = defaultdict(list)
    for node_id, resource, rid, _n, p in holds:
        if (node_id, resource) not in locked:
            if rid not in lost:
                lost[rid] = _lost(p, SCALAR_RAN_OUT, resource)
    for node_id, resource, rid, n, p in holds:
        if rid not in lost:
            groups[(node_id, resource)].append((rid, n, p))
    totals: dict[tuple[str, str, Any, Any], Decimal] = defaultdict(Decimal)
    for (node_id, resource), group in groups.items():
        for _rid, n, p in group:
            totals[(node_id, resource, p.entry.request.start, p.entry.request.end)] += n
    apart = {  # (node, resource) whose windows are equal or apart: one guard per window is exact
        key for key in groups if _apart(k for k in totals if (k[0], k[1]) == key)
    }
    rows = [
        (ids[rid], resource, node_id, n, r.start, r.end, totals[(node_id, resource, r.start, r.end)])
        for (node_id, resource), group in groups.items()
        if (node_id, resource) in apart
        for rid, n, p in group
        for r in (p.entry.request,)
    ]
    held: set[tuple[str, str]] = set()
    if rows:
        columns = [list(c) for c in zip(*rows, strict=True)]
        names = ("ids", "resources", "node_ids", "amounts", "starts", "ends", "totals")
        # <HOLD_SCALARS>: INSERT ... SELECT FROM unnest(...) WHERE peak + group total <= cap RETURNING
        written = await HOLD_SCALARS.run(conn, {**dict(zip(names, columns, strict=True)), "pool_id": pool_id})
        held = {(r[0], r[1]) for r in written.all()}
    for (node_id, resource), group in sorted(groups.items()):
        if all((ids[rid], resource) in held for rid, _, _ in group if rid not in lost):
            continue
        for rid, n, p in group:  # one at a time: the first that no longer fit lose
            if rid in lost or (ids[rid], resource) in held:
                continue
            r = p.entry.request
            one = {
                "allocation_id": ids[rid],
                "resource": resource,
                "node_id": node_id,
                "pool_id": pool_id,
                "amount": n,
                "starts_at": r.start,
                "ends_at": r.end,
            }
            # INSERT INTO scalar_holdings ... WHERE <peak> + :amount <= floor(allocatable * ratio) RETURNING
            if (await conn.execute(HOLD_SCALAR, one)).first() is None:
                lost[rid] = _lost(p, SCALAR_RAN_OUT, resource)


async def _delete_lost(conn: AsyncConnection, allocation_ids: Iterable[str]) -> None:
    """Remove what the losing entries wrote (their scalar holdings, bookings and allocations)."""
    ids = sorted(allocation_ids)
    if not ids:
        return
    # DELETE FROM scalar_holdings WHERE allocation_id = ANY(:ids);
    # DELETE FROM device_bookings WHERE allocation_id = ANY(:ids);
    # DELETE FROM allocations WHERE id = ANY(:ids)
    await conn.execute(sa.delete(scalar_holdings).where(scalar_holdings.c.allocation_id.in_(ids)))
    await conn.execute(sa.delete(device_bookings).where(device_bookings.c.allocation_id.in_(ids)))
    await conn.execute(sa.delete(allocations).where(allocations.c.id.in_(ids)))


def _during(p: _Planned) -> Any:
    r = p.entry.request
    assert r.start is not None and r.end is not None
    return window(r.start, r.end)


def _lost(p: _Planned, kind: str, resource: str | None = None) -> LostRace:
    """The lost race of ``kind`` on the planned node, with the texts of
    :mod:`app.capacity.commit.lost_races` (``resource`` names what ran out)."""
    c = p.candidate
    if kind == NOT_SCHEDULABLE:
        return not_schedulable(c.node_id, c.node_name)
    if kind == ATOM_UNHEALTHY:
        return atom_unhealthy(c.node_id, c.node_name)
    if kind == ATOM_BOOKED:
        return atom_booked(c.node_id, c.node_name)
    assert kind == SCALAR_RAN_OUT and resource is not None
    return scalar_ran_out(c.node_id, c.node_name, resource)
