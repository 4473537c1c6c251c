"""Spot preemption, the I/O half (docs/preemption.md; docs/lifecycle.md).

A regular (``spot: false``) request that the inline placer could not place is planned again with the
placed spot work overlapping its window counted as free (the pure choice is
:mod:`app.placement.preemption`). If that fits, the victims and the preemptor are committed in ONE
transaction, inside ``SAVEPOINT capacity_preempt_<attempt>``, in the lock order:

1. the preemptor's own row (written by the create or the batch) and pools ``FOR SHARE``, taken right
   before the first commit (:class:`~app.db.locks.PoolShare`, shared with the caller's inline attempt);
   a pool archived by then is not placed into (archive waits for us once we hold it);
2. the victims' reservation rows, ``FOR UPDATE`` in id order and only while ``status = 'placed'``
   (:func:`claim_victims`, guarded): a victim released, ended, repaired away or preempted by another
   preemptor meanwhile is missing from the answer, which is a lost race: roll back to the savepoint and
   plan again on fresh reads (so two preemptors never evict the same victim, and the second one never
   evicts more than its own fresh plan needs);
3. the eviction (:func:`evict_victims`): the victims' quota holdings are cut at the preemption instant
   (refunding the remainder), their device bookings and scalar holdings are cut there (removed when
   their window had not started), their allocations get ``releasedAt``, and they become ``preempted``
   with a ``Preempted`` condition and the instant;
4. the preemptor's guarded commit (:func:`app.capacity.commit.single.commit_placements`: nodes -> devices ->
   node_resources -> quota_usage, the preemptor's charge riding on its last statement; the victims' refund
   takes no quota lock, it only shrinks what is held). Work booked on the node meanwhile (a spot reservation
   created while the preemption commits, another preemptor) makes the booking or scalar guard answer short: a
   lost race, and the victims' eviction is rolled back with it (all members of a gang, or none).

A deadlock (40P01) or an exclusion violation (23P01) on any of these is the same lost race, never a 500.
The preemption is a wake edge for the pool (``NOTIFY``, delivered at commit): the victims are
``preempted``, not ``pending``, so no wake ever places them again into what they held.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.answers.reservations import Condition, Preemptible, PreemptibleCandidate
from app.capacity.commit.cuts import cut_allocations
from app.capacity.commit.lost_races import ATOM_UNHEALTHY, NOT_SCHEDULABLE, LostRace, booked_concurrently
from app.capacity.commit.shapes import CommitExtras, Committed, QuotaCharge
from app.capacity.commit.single import commit_placements
from app.capacity.conditions import condition, stored
from app.capacity.edges import notify_pool
from app.capacity.placing.inline import Placed, plan_seed
from app.capacity.planning.snapshot import PoolCache, read_snapshot
from app.db.locks import PoolShare
from app.db.tables import TS, allocations, reservations, scalar_holdings
from app.db.windows import holdings_over
from app.observability.metrics import PREEMPTION_ATTEMPTS, PREEMPTION_VICTIMS
from app.placement.model import PlacementRequest
from app.placement.options import SchedulerOptions
from app.placement.preemption import PreemptionPlan, ScalarHold, SpotWork, plan_preemption
from app.quota import refunds

# one home for the texts (docs/preemption.md)
PREEMPTED = "Preempted"  # the condition type, on the victims and on the preemptor
VICTIM_REASON = "PreemptedByRegularWork"
PREEMPTOR_REASON = "PreemptedSpotWork"
VICTIM_GONE = "victim_gone"  # the lost-race kind of claim_victims
EXCLUDING_KINDS = frozenset({NOT_SCHEDULABLE, ATOM_UNHEALTHY})


def applies(enabled: bool, request: PlacementRequest) -> bool:
    """Preemption is tried for a regular request when ``BC_CAPACITY_PREEMPTION`` is on."""
    return enabled and not request.spot


def victim_gone(node_name: str) -> str:
    """The lost-race reason of a victim that stopped being placed spot work before it was claimed."""
    return f"a spot reservation on {node_name} was released, ended or preempted concurrently"


# ------------------------------------------------------------------------------------------ reads

# (spec->>'spot')::boolean: the predicate of the partial index ix_reservations_placed_spot (NULL: regular)
_SPOT = sa.cast(reservations.c.spec["spot"].astext, sa.Boolean)


async def read_spot_work(
    conn: AsyncConnection, pool_id: str, start: datetime, end: datetime
) -> list[SpotWork]:
    """The placed spot reservations with a live allocation overlapping ``[start, end)`` (the partial
    index of placed spot reservations, then their allocations by reservation id)::

    SELECT r.id, r.tenant_id, r.created_at, a.node_id, a.atoms, a.during
      FROM reservations r JOIN allocations a ON a.reservation_id = r.id
     WHERE r.pool_id = :pool AND r.status = 'placed' AND (r.spec->>'spot')::boolean
       AND a.released_at IS NULL AND a.during && tstzrange(:start, :end, '[)')
    """
    rows = (
        await conn.execute(
            sa.select(
                reservations.c.id,
                reservations.c.tenant_id,
                reservations.c.created_at,
                allocations.c.node_id,
                allocations.c.atoms,
                allocations.c.during,
            )
            .select_from(reservations.join(allocations, allocations.c.reservation_id == reservations.c.id))
            .where(
                reservations.c.pool_id == pool_id,
                allocations.c.released_at.is_(None),
                allocations.c.during.op("&&")(
                    sa.func.tstzrange(sa.literal(start, TS), sa.literal(end, TS), "[)")
                ),
                reservations.c.status == "placed",
                _SPOT,
            )
        )
    ).all()
    atoms: dict[str, dict[str, frozenset[str]]] = defaultdict(dict)
    heads: dict[str, Any] = {}
    for r in rows:
        heads[r.id] = r
        atoms[r.id][r.node_id] = atoms[r.id].get(r.node_id, frozenset()) | frozenset(r.atoms)
    return [
        SpotWork(
            reservation_id=rid,
            tenant_id=r.tenant_id,
            created_at=r.created_at,
            start=r.during.lower,
            end=r.during.upper,
            atoms=dict(atoms[rid]),
        )
        for rid, r in sorted(heads.items())
    ]


async def read_scalar_holds(
    conn: AsyncConnection, node_ids: list[str], names: list[str], start: datetime, end: datetime
) -> list[ScalarHold]:
    """Every holding of ``names`` on ``node_ids`` overlapping ``[start, end)``, with the spot reservation
    holding it (None for any other holder)::

    SELECT h.node_id, h.resource, h.amount, h.starts_at, h.ends_at,
           CASE WHEN r.status = 'placed' AND (r.spec->>'spot')::boolean THEN r.id END
      FROM scalar_holdings h JOIN allocations a ON a.id = h.allocation_id
      JOIN reservations r ON r.id = a.reservation_id
     WHERE h.node_id = ANY(:nodes) AND h.resource = ANY(:names) AND h.ends_at > :start AND h.starts_at < :end
    """
    if not node_ids or not names:
        return []
    spot_id = sa.case((sa.and_(reservations.c.status == "placed", _SPOT), reservations.c.id), else_=sa.null())
    rows = (
        await conn.execute(
            holdings_over(
                scalar_holdings,
                start,
                end,
                scalar_holdings.c.node_id.in_(node_ids),
                scalar_holdings.c.resource.in_(names),
                keys=(scalar_holdings.c.node_id,),
            )
            .add_columns(spot_id.label("spot_reservation"))
            .select_from(
                scalar_holdings.join(allocations, allocations.c.id == scalar_holdings.c.allocation_id).join(
                    reservations, reservations.c.id == allocations.c.reservation_id
                )
            )
        )
    ).all()
    return [
        ScalarHold(r.node_id, r.resource, Decimal(r.amount), r.starts_at, r.ends_at, r.spot_reservation)
        for r in rows
    ]


async def plan_with_preemption(
    conn: AsyncConnection,
    cache: PoolCache,
    request: PlacementRequest,
    options: SchedulerOptions,
    now: datetime,
    spot: list[SpotWork] | None = None,
) -> PreemptionPlan | None:
    """Plan ``request`` by evicting overlapping spot work (plain reads; the commit re-checks); ``spot``:
    the spot work already read (else read here). The whole pool is read, so a node that fits without
    victims (after lost races elsewhere) ranks first and nothing is evicted for nothing."""
    assert request.start is not None and request.end is not None
    if spot is None:
        spot = await read_spot_work(conn, request.pool_id, request.start, request.end)
    if not spot:
        return None
    head, snapshot = await read_snapshot(conn, cache, request.pool_id, request.start, request.end)
    if head.archived:
        return None
    nodes = sorted({n for w in spot for n in w.atoms})
    names = (
        sorted(request.resources)
        if request.binding != "node"
        else sorted({r for n in snapshot.nodes if n.id in set(nodes) for r in n.state.resources})
    )
    holds = await read_scalar_holds(conn, nodes, names, request.start, request.end)
    return plan_preemption(request, snapshot, spot, holds, options, now)


# ------------------------------------------------------------------------------------------ writes


async def claim_victims(conn: AsyncConnection, plan: PreemptionPlan, node_name: str) -> LostRace | None:
    """Lock every victim's reservation row while it is still placed, in id order (two preemptors lock
    shared victims in one order); a missing one is a lost race."""
    ids = [v.reservation_id for v in plan.victims]
    # SELECT id FROM reservations WHERE id = ANY(:ids) AND status = 'placed' ORDER BY id FOR UPDATE
    #                      -- fewer rows: released, ended, repaired or preempted meanwhile (re-checked
    #                      -- after the lock wait, as PostgreSQL re-evaluates a locked row)
    got = (
        await conn.execute(
            sa.select(reservations.c.id)
            .where(reservations.c.id.in_(ids), reservations.c.status == "placed")
            .order_by(reservations.c.id)
            .with_for_update()
        )
    ).all()
    if len(got) != len(ids):
        return LostRace(plan.placements[0].node_id, victim_gone(node_name), VICTIM_GONE)
    return None


def victim_condition(at: datetime) -> Condition:
    """The condition of a preempted spot reservation: its holdings end at ``at``."""
    return condition(
        PREEMPTED,
        VICTIM_REASON,
        f"preempted at {at.isoformat()} by regular work; what it held ends there",
        at=at.isoformat(),
    )


def preemptor_condition(at: datetime, victims: tuple[SpotWork, ...], tenant_id: str) -> Condition:
    """The preemptor's condition: the victims of its own tenant by id, the others only counted."""
    visible = [v.reservation_id for v in victims if v.tenant_id == tenant_id]
    hidden = len(victims) - len(visible)
    return condition(
        PREEMPTED,
        PREEMPTOR_REASON,
        f"placed by preempting {len(victims)} spot reservations at {at.isoformat()}"
        + (f" ({hidden} of other tenants)" if hidden else ""),
        at=at.isoformat(),
        reservationIds=visible,
        hiddenReservations=hidden,
    )


async def evict_victims(conn: AsyncConnection, plan: PreemptionPlan, at: datetime) -> None:
    """Cut the claimed victims at ``at`` and mark them preempted (their rows are locked by
    :func:`claim_victims`, so nothing here can race): quota first, then bookings and scalar holdings
    (the cut of a release, :func:`app.capacity.commit.cuts.cut_allocations`), then the rows."""
    ids = [v.reservation_id for v in plan.victims]
    for rid in ids:
        await refunds.cut_holdings(conn, rid, at)  # the refund of the remainder
    # SELECT id FROM allocations WHERE reservation_id = ANY(:ids) AND released_at IS NULL
    live = list(
        (
            await conn.execute(
                sa.select(allocations.c.id).where(
                    allocations.c.reservation_id.in_(ids), allocations.c.released_at.is_(None)
                )
            )
        ).scalars()
    )
    await cut_allocations(conn, live, at)
    # UPDATE reservations SET status = 'preempted', conditions = conditions || :condition,
    #        released_at = :at, updated_at = now() WHERE id = ANY(:ids)
    await conn.execute(
        sa.update(reservations)
        .where(reservations.c.id.in_(ids))
        .values(
            status="preempted",
            conditions=reservations.c.conditions.op("||")(sa.literal(stored([victim_condition(at)]), JSONB)),
            released_at=at,
            updated_at=sa.func.now(),
        )
    )


async def commit_preemption(
    conn: AsyncConnection,
    request: PlacementRequest,
    plan: PreemptionPlan,
    reservation_id: str,
    attempt: int,
    at: datetime,
    charge: QuotaCharge | None = None,
) -> tuple[Committed, ...] | LostRace:
    """Evict ``plan``'s victims at ``at`` and commit its placements (with ``charge`` riding on the last
    node's statement), in ``SAVEPOINT capacity_preempt_<attempt>``: everything, or on a lost race nothing
    (rolled back). Raises QuotaExceeded (the caller's transaction rolls back: nothing is evicted)."""
    assert request.start is not None and request.end is not None
    savepoint = f"capacity_preempt_{int(attempt)}"
    first = plan.placements[0]
    await conn.exec_driver_sql(f"SAVEPOINT {savepoint}")
    outcome: tuple[Committed, ...] | LostRace
    try:
        lost = await claim_victims(conn, plan, first.node_name)
        if lost is None:
            await evict_victims(conn, plan, at)
            outcome = await commit_placements(
                conn,
                request,
                plan.placements,
                reservation_id,
                attempt,
                request.start,
                request.end,
                CommitExtras(charge=charge),
            )
        else:
            outcome = lost
    except DBAPIError as exc:
        outcome = booked_concurrently(exc, first.node_id, first.node_name)
    if isinstance(outcome, LostRace):
        await conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {savepoint}")
    await conn.exec_driver_sql(f"RELEASE SAVEPOINT {savepoint}")
    return outcome


@dataclass(frozen=True, slots=True)
class PlacedByPreemption:
    """The preemptor placed: its allocations, the victims evicted and the preemptor's condition."""

    placed: Placed
    victims: tuple[SpotWork, ...]
    condition: Condition


@dataclass(frozen=True, slots=True)
class PreemptOptions:
    """How :func:`place_preempting` runs: scheduler options, attempts, and the preemptor's quota charge,
    which rides on its guarded commit (raises QuotaExceeded from there)."""

    options: SchedulerOptions
    max_attempts: int = 3
    charge: QuotaCharge | None = None


async def place_preempting(
    conn: AsyncConnection,
    cache: PoolCache,
    request: PlacementRequest,
    reservation_id: str,
    how: PreemptOptions,
    now: datetime,
    pool_share: PoolShare | None = None,
) -> PlacedByPreemption | None:
    """Place regular ``request`` by preempting spot work, inside the caller's open transaction (the
    reservation row already written); ``now`` is the database clock. The pool row is locked ``FOR
    SHARE`` right before the first commit (``pool_share``: the caller's, when its inline attempt may have
    taken it already; else one of this call's own). None when preemption would not make it fit, the pool
    is archived (``pool_share.archived`` says so when the lock found it), or every attempt lost a race
    (the caller keeps its pending reason)."""
    assert request.start is not None and request.end is not None
    at = min(now, request.start)  # a start a little in the past (clock skew) is the preemption instant
    pool_share = pool_share or PoolShare(request.pool_id)
    spot: list[SpotWork] | None = await read_spot_work(conn, request.pool_id, request.start, request.end)
    if not spot:
        return None  # no spot work overlaps: not an attempt (nothing to preempt)
    excluded: dict[str, str] = {}
    for attempt in range(1, how.max_attempts + 1):
        options = replace(
            how.options,
            seed=plan_seed(reservation_id, attempt),
            excluded_nodes=how.options.excluded_nodes | frozenset(excluded),
            exclusion_reasons={**how.options.exclusion_reasons, **excluded},
        )
        plan = await plan_with_preemption(conn, cache, request, options, at, spot)
        spot = None  # a replan reads the spot work again
        if plan is None:
            PREEMPTION_ATTEMPTS.labels("no_fit").inc()
            return None
        # SELECT * FROM pools WHERE id = :pool FOR SHARE  -- once, before the victims' rows (lock order)
        if not await pool_share.take(conn):
            return None
        outcome = await commit_preemption(conn, request, plan, reservation_id, 100 + attempt, at, how.charge)
        if isinstance(outcome, LostRace):
            if outcome.kind in EXCLUDING_KINDS:
                excluded[outcome.node_id] = outcome.reason
            continue
        await notify_pool(conn, request.pool_id)  # wake edge: a preemption (victims stay preempted)
        PREEMPTION_ATTEMPTS.labels("placed").inc()
        PREEMPTION_VICTIMS.observe(len(plan.victims))
        return PlacedByPreemption(
            Placed(outcome), plan.victims, preemptor_condition(at, plan.victims, request.tenant_id)
        )
    PREEMPTION_ATTEMPTS.labels("lost_race").inc()
    return None


# ------------------------------------------------------------------------------------------ preview


def preemptible_view(plan: PreemptionPlan, tenant_id: str, starts_at: datetime) -> Preemptible:
    """Preview's ``preemptible``: the count of victims, when the preemptor would start, the nodes and
    atoms it would take (with the victims there), and the victims' ids for the caller's tenant only
    (other tenants' victims are counted in ``hiddenReservations``, never named)."""
    visible = [v.reservation_id for v in plan.victims if v.tenant_id == tenant_id]
    return Preemptible(
        reservations=len(plan.victims),
        startsAt=starts_at.isoformat(),
        candidates=[
            PreemptibleCandidate(
                nodeId=e.candidate.node_id,
                nodeName=e.candidate.node_name,
                atoms=list(e.candidate.atoms),
                victims=len(e.victims),
            )
            for e in plan.evictions
        ],
        reservationIds=visible,
        hiddenReservations=len(plan.victims) - len(visible),
    )


async def preview_preemptible(
    conn: AsyncConnection,
    cache: PoolCache,
    request: PlacementRequest,
    options: SchedulerOptions,
    now: datetime,
) -> Preemptible | None:
    """:func:`preemptible_view` of the plan a reserve would make now, or None (no plain reads beyond
    the plan's; nothing is written)."""
    assert request.start is not None
    plan = await plan_with_preemption(conn, cache, request, options, min(now, request.start))
    return None if plan is None else preemptible_view(plan, request.tenant_id, request.start)
