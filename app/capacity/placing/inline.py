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
and no other commit can book on the node until this transaction ends. A retry on the node therefore
cannot lose a second race there; without the lock, two processes reaching for the last free atoms in
turn could each lose every attempt while atoms were still free. The lock is taken only after a lost
race (contention), in the lock order pools -> nodes; a deadlock on it (40P01) is one more lost race.
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

import hashlib
from collections.abc import Awaitable, Callable
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
    """Nothing fit (or every attempt lost a race): the Unschedulable reason."""

    reason: str


def plan_seed(reservation_id: str, attempt: int) -> int:
    """The seeded random of the topN pick: derived from the reservation id, so a placement replays."""
    digest = hashlib.sha256(f"{reservation_id}:{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


async def _hold_node_for_retry(conn: AsyncConnection, node_id: str) -> None:
    """Lock the node a race was lost on (``FOR UPDATE``, kept to the end of the transaction) before it is
    read again; a deadlock or a lock conflict answer leaves it unlocked (the retry may lose again), and
    so does a node that is gone (the retry reads that)."""
    try:
        async with conn.begin_nested():  # SAVEPOINT: a deadlock aborts only this statement
            # SELECT * FROM nodes WHERE id = :node FOR UPDATE
            await lock_node(conn, node_id)
    except NotFound:
        pass
    except DBAPIError as exc:
        if sqlstate(exc) not in LOST_RACE_SQLSTATES:
            raise


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
            return Pending(ARCHIVED_POOL)
        plan = outcome_plan.plan
        if isinstance(plan, Rejections):
            return Pending(plan.summary)
        assert isinstance(plan, Plan)
        placements = plan.placements  # the chosen candidate, or a gang's members
        tokens = [
            cache.assume(request.pool_id, c.node_id, c.booked_atoms, request.start, request.end)
            for c in placements
        ]
        try:
            if before_commit is not None:
                await before_commit(attempt, plan.chosen)
            # SELECT * FROM pools WHERE id = :pool FOR SHARE  -- once: an archive waits for our commit
            if not await pool_share.take(conn):
                for token in tokens:
                    cache.forget(request.pool_id, token)
                return Pending(ARCHIVED_POOL)
            outcome = await commit_placements(
                conn, request, placements, reservation_id, attempt, request.start, request.end, extras
            )
        except BaseException:
            for token in tokens:
                cache.forget(request.pool_id, token)
            raise
        if not isinstance(outcome, LostRace):
            return Placed(outcome, tuple(tokens))
        for token in tokens:
            cache.forget(request.pool_id, token)
        LOST_RACES.labels(outcome.kind).inc()
        lost.append(outcome)
        if outcome.kind not in EXCLUDING_KINDS and attempt < max_attempts:
            await _hold_node_for_retry(conn, outcome.node_id)
    return Pending(unschedulable_after([r.reason for r in lost]))


place_inline = record_placement("inline", _result)(_place_inline)
place_woken = record_placement("wake", _result)(_place_inline)
""":func:`_place_inline` counted as the wake-edge controller's attempts (``placer="wake"``)."""


async def db_now(conn: AsyncConnection) -> datetime:
    """The database clock (``SELECT now()``): the default start of a request."""
    return (await conn.exec_driver_sql("SELECT now()")).scalar_one()
