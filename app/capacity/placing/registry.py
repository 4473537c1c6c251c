"""The placer registry (docs/placement-rules.md, "Two placers"; docs/scaling.md).

A placer has an ``id`` and ``place(conn, request, context) -> Placed | Pending``, called inside the
caller's open transaction with the reservation row already written. One is registered: ``inline``
(:class:`InlinePlacer`) plans and commits now with the guarded statements
(:func:`app.capacity.placing.inline.place_inline`).

``pool-lease`` is the other way a create can go, and it is a queue, not a placer: the create writes the
row ``queued`` with its pool's queue edge in one statement (:data:`app.capacity.queue.worker.ENQUEUE`,
:func:`queue_edge`), and a batch worker of some replica (:mod:`app.capacity.queue.worker`) plans queued
reservations oldest first and commits them together (:mod:`app.capacity.placing.batch`).

Gangs, whole-node leases, ``start: "earliest"`` creates, BookingRepair, wakes and preemption need an
answer at once: they always place
inline (:func:`placer_id_for_request` answers ``inline`` for those requests whatever the setting).
``BC_CAPACITY_PLACER`` (``CapacityConfig.placer``) picks the way of plain reservations.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Protocol

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity.commit.shapes import NO_EXTRAS, CommitExtras, MarkPlaced, QuotaCharge
from app.capacity.placing.inline import Pending, Placed, place_inline, place_woken
from app.capacity.planning.snapshot import PoolCache, PoolHead
from app.placement.model import Candidate, PlacementRequest
from app.placement.options import SchedulerOptions
from app.placement.request import ReservationRequest

INLINE = "inline"
POOL_LEASE = "pool-lease"
PLACER_IDS = (INLINE, POOL_LEASE)
WAKE = "wake"  # not a placer: the label of the inline placer's attempts made by the wake controller
QUEUE_CHANNEL = "bc_queue"  # payload: the pool id whose queue has work
# payload: one line per reservation no longer queued, ``<id>\t<view JSON>`` or a bare ``<id>``
DECIDED_CHANNEL = "bc_decided"


def queue_edge(pool_id: sa.ColumnElement[str]) -> sa.ColumnElement[object]:
    """``pg_notify('bc_queue', <pool id>)``: the queue edge of a pool, for a statement's ``RETURNING``
    (delivered when the transaction commits)."""
    return sa.func.pg_notify(QUEUE_CHANNEL, pool_id)


@dataclass(frozen=True, slots=True)
class Admission:
    """The admission context of a call that comes from an admitted request: who is charged, how much,
    and the ``charge`` that rides on the guarded commit's last statement (lock order: ... ->
    node_resources -> quota_usage, last; a refused charge raises QuotaExceeded)."""

    tenant_id: str
    amounts: Mapping[str, Decimal]
    charge: QuotaCharge | None = None


@dataclass(frozen=True, slots=True)
class PlacementContext:
    """Everything a placer needs beside the connection and the request (docs/placement-rules.md,
    PlacementContext).

    ``now``: the database clock (``SELECT now()`` or the reservation row's ``created_at``).
    ``options``: the scheduler plugins, scorer weights, topN and the seeded random's seed (derived per
    attempt from ``reservation_id``, so a placement replays). ``admission``: set when the call comes
    from an admitted request. ``before_commit(attempt, candidate)``: tests lose races on purpose there.
    ``mark``: mark the reservation ``placed`` with the commit's statements. ``head``: the pool head the
    caller read in this transaction (the first plan does not read it again; the pool is still locked
    ``FOR SHARE`` right before the first commit).
    """

    now: datetime
    cache: PoolCache
    options: SchedulerOptions
    reservation_id: str
    max_attempts: int = 3
    shortlist_min: int = 48
    admission: Admission | None = None
    before_commit: Callable[[int, Candidate], Awaitable[None]] | None = None
    # the ``placer`` label its attempts are counted under: ``inline``, or ``wake`` (the wake controller)
    recorded_as: str = INLINE
    mark: MarkPlaced | None = None
    head: PoolHead | None = None

    @property
    def extras(self) -> CommitExtras:
        """What rides on the guarded commit: the admission's quota charge and the placed mark."""
        charge = self.admission.charge if self.admission is not None else None
        if charge is None and self.mark is None:
            return NO_EXTRAS
        return CommitExtras(charge=charge, mark=self.mark)

    @property
    def seed(self) -> int:
        """The seed of the topN pick's random."""
        return self.options.seed

    @property
    def top_n(self) -> int:
        """How many of the best candidates the pick draws from."""
        return self.options.top_n


Outcome = Placed | Pending


class Placer(Protocol):
    """``place(conn, request, context)`` in the caller's transaction; ``id`` names it in the registry
    (a plugin may register another)."""

    id: str

    async def place(
        self, conn: AsyncConnection, request: PlacementRequest, context: PlacementContext
    ) -> Outcome:
        """Place (or queue) ``request`` for ``context.reservation_id``."""
        ...


class InlinePlacer:
    """Plan now and commit with the guarded statements (:func:`app.capacity.placing.inline.place_inline`)."""

    id = INLINE

    async def place(
        self, conn: AsyncConnection, request: PlacementRequest, context: PlacementContext
    ) -> Outcome:
        """:class:`Placed` (allocations written in ``conn``'s transaction) or :class:`Pending`."""
        place = place_woken if context.recorded_as == WAKE else place_inline
        return await place(
            conn,
            context.cache,
            request,
            context.reservation_id,
            context.options,
            context.max_attempts,
            context.shortlist_min,
            context.before_commit,
            context.extras,
            context.head,
        )


PLACERS: dict[str, Placer] = {INLINE: InlinePlacer()}


def placer(placer_id: str) -> Placer:
    """The placer registered as ``placer_id`` (``inline``); KeyError otherwise."""
    return PLACERS[placer_id]


def must_place_inline(request: PlacementRequest | ReservationRequest) -> bool:
    """Gangs and whole-node leases always place inline (docs/placement-rules.md): they need an answer at
    once. The one
    rule, for a placement request or the create body it comes from (both carry ``gang`` and
    ``binding``). A create with ``start: "earliest"`` too: it searches its window and commits at once
    (docs/lifecycle.md, "Earliest start")."""
    if isinstance(request, ReservationRequest) and request.earliest:
        return True
    return request.gang is not None or request.binding == "node"


def placer_id_for_request(configured: str, request: PlacementRequest | ReservationRequest) -> str:
    """How a create goes: the configured way (``inline`` or ``pool-lease``), except ``inline`` for the
    requests that must be placed at once (:func:`must_place_inline`)."""
    return INLINE if must_place_inline(request) else configured
