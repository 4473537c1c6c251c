"""The inline placer (docs/placement-rules.md, "Two placers", "Commit and lock order").

Plan on plain reads, take the pool row lock (``FOR SHARE``, :class:`~app.db.locks.PoolShare`) right
before the first commit, commit the chosen candidate with guarded statements inside
``SAVEPOINT capacity_place_<attempt>``; a lost race
replans on fresh reads, at most ``max_attempts`` times (docs/lifecycle.md: a lost race
re-reads the node it lost on). After ``an atom on <node> was booked concurrently`` or ``<resource> on
<node> ran out`` the node stays a candidate: the replan reads its bookings and holdings again and may
choose it again (other atoms, or what is left), and rejects it (``fits``/``scalars``) only when the
fresh read leaves no room. After ``<node> is no longer schedulable`` or ``an atom on <node> turned
unhealthy or unbookable`` the node is excluded from the replan (its rejection is that reason).

Before that re-read the placer locks the lost node's row ``FOR UPDATE``: the commits that beat it hold
``FOR SHARE`` on it until they commit, so the lock waits for them, the re-read sees what they booked,
and no other commit can book on the node while the lock is held. A retry on the node therefore
cannot lose a second race there; without the lock, two processes reaching for the last free atoms in
turn could each lose every attempt while atoms were still free. The lock is taken only after a lost
race (contention), in the lock order pools -> nodes; a deadlock on it (40P01) is one more lost race.

The held node is kept only while it is the lowest node id of the next commit (:class:`NodeHold`), so
the transaction never holds one node while it asks for a lower one (the lock order: several nodes in id
order, docs/architecture.md). The lock is taken inside ``SAVEPOINT capacity_hold``, left open; when the
replan chooses another node (or a gang member below it), when it finds no fit, and when the placer
answers pending, ``ROLLBACK TO SAVEPOINT capacity_hold`` lets the node go before anything else is
locked. Holding the lost node over a commit on another one (a node taken in loss order, not id order)
made cycles between placers, and a health write's ``FOR UPDATE`` queued on one of those nodes was
caught in them (tests/capacity/test_hold_order.py). A new lost race lets the held node go before the
next one is locked, so at most one node is held between attempts.
The critical section is
the commit alone. Quota is charged by the commit itself, last (``extras``: lock order pools -> nodes
-> devices -> node_resources -> quota_usage), so a tenant's quota row is held from the commit's lock
statement to COMMIT only, not over the plan. A caller that inserted the reservation may have read the
pool row already (``head``, a plain read): the first plan then does not read it again. Until the lock,
nothing of this transaction holds the pool row but the foreign keys' ``FOR KEY SHARE``, so node adds,
label changes and archives do not wait for plans; a pool archived between the plan and the lock answers
``the pool is archived``, as a pool archived before the create does, and nothing is written.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.commit.lost_races import (
    ATOM_UNHEALTHY,
    LOST_RACE_SQLSTATES,
    NOT_SCHEDULABLE,
    LostRace,
    unschedulable_after,
)
from app.capacity.commit.shapes import NO_EXTRAS, CommitExtras, Committed
from app.capacity.commit.single import commit_placements
from app.capacity.planning.plan import plan_request
from app.capacity.planning.snapshot import PoolCache, PoolHead
from app.db.locks import PoolShare, lock_node
from app.db.tx import sqlstate
from app.errors import NotFound
from app.observability.metrics import LOST_RACES, record_placement
from app.placement.model import Candidate, PlacementRequest, Plan, Rejections
from app.placement.options import SchedulerOptions
from app.placement.summary import ARCHIVED_POOL
from app.placement.why_not import WhyNot

# lost races after which the node is left out of the replan; after the others it is read again
EXCLUDING_KINDS = frozenset({NOT_SCHEDULABLE, ATOM_UNHEALTHY})


@dataclass(frozen=True, slots=True)
class Placed:
    """Placed: the allocations written in the caller's transaction."""

    allocations: tuple[Committed, ...]
    # the cache assumptions of the committed atoms: forget them once the transaction has committed
    # (or rolled back); until then other plans of this process must not reach for those atoms
    assumptions: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Pending:
    """Nothing fit (or every attempt lost a race): the Unschedulable reason, and the last plan's rejection
    rows and nearest misses when it found nothing (docs/reasons.md)."""

    reason: str
    why: WhyNot | None = None


def plan_seed(reservation_id: str, attempt: int) -> int:
    """The seeded random of the topN pick: derived from the reservation id, so a placement replays."""
    digest = hashlib.sha256(f"{reservation_id}:{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


HOLD_SAVEPOINT = "capacity_hold"


class NodeHold:
    """The node a race was lost on, locked ``FOR UPDATE`` for the replan inside ``SAVEPOINT
    capacity_hold`` (left open, so the lock can be let go again); at most one per placement.

    :meth:`take` locks a node (letting the one held go first); :meth:`keep_for` lets it go unless it is
    the lowest node id of the commit about to run (the lock order: a held node is never followed by a
    lower one); :meth:`let_go` rolls back to the savepoint, which drops the lock (nothing else was
    written after it: the plans only read, a lost commit is rolled back to its own savepoint)."""

    __slots__ = ("node_id",)

    def __init__(self) -> None:
        self.node_id: str | None = None

    async def take(self, conn: AsyncConnection, node_id: str) -> None:
        """Hold ``node_id`` (``SAVEPOINT capacity_hold; SELECT * FROM nodes WHERE id = :node FOR
        UPDATE``). A deadlock or a lock conflict answer leaves it unheld (the retry may lose again), and
        so does a node that is gone (the retry reads that)."""
        if self.node_id == node_id:
            return
        await self.let_go(conn)
        await conn.exec_driver_sql(f"SAVEPOINT {HOLD_SAVEPOINT}")
        try:
            await lock_node(conn, node_id)
        except NotFound:
            await _drop_hold_savepoint(conn)
            return
        except DBAPIError as exc:
            if sqlstate(exc) not in LOST_RACE_SQLSTATES:
                raise
            await _drop_hold_savepoint(conn)
            return
        self.node_id = node_id

    async def keep_for(self, conn: AsyncConnection, node_ids: Iterable[str]) -> None:
        """Before a commit on ``node_ids``: keep the held node only when it is the lowest of them."""
        if self.node_id is not None and min(node_ids) != self.node_id:
            await self.let_go(conn)

    async def let_go(self, conn: AsyncConnection) -> None:
        """Drop the held node's lock (``ROLLBACK TO SAVEPOINT capacity_hold; RELEASE SAVEPOINT
        capacity_hold``); nothing when none is held."""
        if self.node_id is not None:
            self.node_id = None
            await _drop_hold_savepoint(conn)


async def _drop_hold_savepoint(conn: AsyncConnection) -> None:
    await conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {HOLD_SAVEPOINT}")
    await conn.exec_driver_sql(f"RELEASE SAVEPOINT {HOLD_SAVEPOINT}")


def _result(outcome: Placed | Pending) -> str:
    return "placed" if isinstance(outcome, Placed) else "pending"


async def _place_inline(
    conn: AsyncConnection,
    cache: PoolCache,
    request: PlacementRequest,
    reservation_id: str,
    options: SchedulerOptions,
    max_attempts: int,
    shortlist_min: int = 48,
    before_commit: Callable[[int, Candidate], Awaitable[None]] | None = None,
    extras: CommitExtras = NO_EXTRAS,
    head: PoolHead | None = None,
    pool_share: PoolShare | None = None,
) -> Placed | Pending:
    """Place ``request`` now, inside the caller's open transaction.

    Returns :class:`Placed` with the allocation written, or :class:`Pending` with the reason: the
    pending summary of the last plan, ``the pool is archived``, or ``Unschedulable after <n>
    conflicting attempts: <reason>; ...`` when every attempt lost a race. ``before_commit(attempt,
    candidate)`` runs between the plan and its commit, before the pool lock (tests use it to lose races
    on purpose, or to change the inventory while a plan is open). ``extras`` ride with the commit: the
    quota charge (a refusal raises QuotaExceeded) and the placed mark. ``head``: the pool row the caller
    read in this transaction (the first plan uses it). ``pool_share``: the transaction's pool lock, when
    the caller shares it with a later step (preemption); else one of this call's own.
    """
    assert request.start is not None and request.end is not None
    lost: list[LostRace] = []
    pool_share = pool_share or PoolShare(request.pool_id)
    hold = NodeHold()  # the last node lost on, while the next commit may hold it in the lock order
    for attempt in range(1, max_attempts + 1):
        excluded = [r for r in lost if r.kind in EXCLUDING_KINDS]
        attempt_options = replace(
            options,
            seed=plan_seed(reservation_id, attempt),
            # the caller's exclusions (repair tries the same node first) and the nodes lost on
            excluded_nodes=options.excluded_nodes | frozenset(r.node_id for r in excluded),
            exclusion_reasons={**options.exclusion_reasons, **{r.node_id: r.reason for r in excluded}},
        )
        outcome_plan = await plan_request(
            conn, cache, request, attempt_options, shortlist_min, head=head if attempt == 1 else None
        )
        if outcome_plan.head.archived:
            return await _pending(conn, hold, ARCHIVED_POOL)
        plan = outcome_plan.plan
        if isinstance(plan, Rejections):
            return await _pending(conn, hold, plan.summary, outcome_plan.why_not(request, attempt_options))
        assert isinstance(plan, Plan)
        placements = plan.placements  # the chosen candidate, or a gang's members
        # the node held since the last lost race stays held only if the commit locks nothing below it
        await hold.keep_for(conn, (c.node_id for c in placements))
        before = None if before_commit is None else functools.partial(before_commit, attempt, plan.chosen)
        outcome = await commit_assumed(
            conn, cache, request, placements, reservation_id, attempt, extras, pool_share, before
        )
        if outcome is None:
            return await _pending(conn, hold, ARCHIVED_POOL)
        if isinstance(outcome, Placed):
            return outcome
        LOST_RACES.labels(outcome.kind).inc()
        lost.append(outcome)
        if outcome.kind not in EXCLUDING_KINDS and attempt < max_attempts:
            await hold.take(conn, outcome.node_id)
    return await _pending(conn, hold, unschedulable_after([r.reason for r in lost]))


async def commit_assumed(
    conn: AsyncConnection,
    cache: PoolCache,
    request: PlacementRequest,
    placements: tuple[Candidate, ...],
    reservation_id: str,
    attempt: int,
    extras: CommitExtras,
    pool_share: PoolShare,
    before_commit: Callable[[], Awaitable[None]] | None = None,
) -> Placed | LostRace | None:
    """Commit ``placements`` (a plan's chosen candidate, a gang's members, a plan token's nodes) for
    ``request`` through the guarded commit (``SAVEPOINT capacity_place_<attempt>``), their atoms assumed
    in ``cache`` from before the pool lock on, so that this process's other plans do not reach for them.

    ``before_commit()`` runs first (tests lose races there), then the pool's ``FOR SHARE`` is taken
    (``pool_share``: ``SELECT archived_at FROM pools WHERE id = :pool FOR SHARE``, once per transaction:
    an archive waits for this commit). Returns :class:`Placed`, whose assumptions the caller forgets once
    its transaction ends; a :class:`LostRace`, or None when the pool was archived, with the assumptions
    forgotten already (and on an exception too)."""
    assert request.start is not None and request.end is not None
    tokens = [
        cache.assume(request.pool_id, c.node_id, c.booked_atoms, request.start, request.end)
        for c in placements
    ]
    outcome: tuple[Committed, ...] | LostRace | None = None
    try:
        if before_commit is not None:
            await before_commit()
        if await pool_share.take(conn):
            outcome = await commit_placements(
                conn, request, placements, reservation_id, attempt, request.start, request.end, extras
            )
    except BaseException:
        for token in tokens:
            cache.forget(request.pool_id, token)
        raise
    if outcome is not None and not isinstance(outcome, LostRace):
        return Placed(outcome, tuple(tokens))
    for token in tokens:
        cache.forget(request.pool_id, token)
    return outcome


async def _pending(conn: AsyncConnection, hold: NodeHold, reason: str, why: WhyNot | None = None) -> Pending:
    """Nothing placed: the held node is let go first, so the caller's next steps (preemption claims
    reservation rows, earlier in the lock order) hold no node."""
    await hold.let_go(conn)
    return Pending(reason, why)


place_inline = record_placement("inline", _result)(_place_inline)
place_woken = record_placement("wake", _result)(_place_inline)
""":func:`_place_inline` counted as the wake-edge controller's attempts (``placer="wake"``)."""


async def db_now(conn: AsyncConnection) -> datetime:
    """The database clock (``SELECT now()``): the default start of a request."""
    return (await conn.exec_driver_sql("SELECT now()")).scalar_one()


async def statement_now(conn: AsyncConnection) -> datetime:
    """The database clock as this statement starts (``SELECT statement_timestamp()``), for an instant
    taken after a row lock: ``now()`` is the transaction's BEGIN, which may come before the instants
    written by whoever held the row first (a release waiting for BookingRepair, docs/lifecycle.md)."""
    return (await conn.exec_driver_sql("SELECT statement_timestamp()")).scalar_one()
