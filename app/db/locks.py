"""Row locks and the one lock order (docs/placement-rules.md, "Commit and lock order").

Every transaction that locks rows of several of these tables takes them in this order, and only in this
order, so two transactions never wait on each other in a cycle::

    reservations (its own row) -> pool lease -> pools -> nodes -> devices -> node_resources -> quota_usage
        -> pool_capacity_rollup

- ``reservations``: create (the idempotency index entry), release, extend, the wake edge, repair and a
  drain's move lock the one reservation row first (:mod:`app.capacity.reservations.create`,
  :mod:`app.capacity.controllers.wake`; the others by id through :func:`lock_reservation`).
- ``pools``: :func:`lock_pool` (``FOR NO KEY UPDATE`` to change the pool's inventory or archive it,
  ``FOR SHARE`` to place in it or to change one node); a pool's ``inventory_version`` bump takes the
  same row lock. A placement takes its ``FOR SHARE`` only right before its first guarded commit
  (:class:`PoolShare`), so the critical section is the commit alone: an inventory change waits for the
  commits in flight, never for plans (docs/lifecycle.md, "Lock order"). ``NO KEY`` because every
  row that names its pool (a reservation, an allocation, a booking) holds ``FOR KEY SHARE`` on it
  through its foreign key from its insert to its transaction's end; ``FOR UPDATE`` would wait for those
  too, so a node add would wait behind every create's plan again.
- ``nodes``: :func:`lock_node`; several nodes in id order (:mod:`app.inventory.liveness`).
- ``devices`` then ``node_resources``: the guarded commit (:mod:`app.capacity.commit.single`) and an agent's
  Hello (:mod:`app.inventory.hello`), devices in id order.
- ``quota_usage``: the quota charge rides on the guarded commit's last statement and locks the
  tenant's rows in sorted resource order (:mod:`app.capacity.commit.single`, :mod:`app.quota.charges`), so a
  tenant's reserves are serialized for that statement only, not for the plan (issue 15). Refunds
  (release, repair, preemption, end) take no ``quota_usage`` lock: they only shrink what is held. A batch
  (:mod:`app.capacity.placing.batch`) charges its entries last too, after their bookings.
- ``pool_capacity_rollup``: last, when a node's capacity is added (:mod:`app.inventory.node_rows`); no
  commit writes it.

The pool lease, a transaction-scoped advisory lock per pool (:func:`pool_lease`,
:func:`wait_for_pool_lease`), sits between ``reservations`` and ``pools``: one batch at a time plans a
pool, across every replica. The pool-lease worker's claim tries it and never waits (a worker that does
not get it leaves the pool to the holder); a bulk create waits for it after writing its own reservation
rows and before any other lock, so the holder never waits on a row the waiter holds.

A transaction may skip any table of the order, never go back to an earlier one. The functions here raise
:class:`~app.errors.NotFound` for a row that does not exist (after the lock, nothing is left to check),
except :func:`lock_reservation`, whose callers decide what an absent row means (a 404 that hides another
tenant's reservation, or nothing left to do for a controller).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.prepared import Prepared
from app.db.tables import nodes, pools, reservations
from app.errors import NotFound, quote_input

LOCK_ORDER: tuple[str, ...] = (
    "reservations",
    "pool lease",
    "pools",
    "nodes",
    "devices",
    "node_resources",
    "quota_usage",
    "pool_capacity_rollup",
)


POOL_LEASE_LOCK = 150_007  # the advisory lock class of pool leases (the key is hashtext(pool id))


def pool_lease(pool_id: sa.ColumnElement[str]) -> sa.ColumnElement[bool]:
    """``pg_try_advisory_xact_lock(POOL_LEASE_LOCK, hashtext(<pool id>))``: the pool's lease for the
    rest of the transaction, true when this transaction holds it (it never waits). One batch at a time
    plans a pool, so the batches of two replicas never race for the same atoms and scalar rows. A holder
    that dies loses the lease with its transaction."""
    return sa.func.pg_try_advisory_xact_lock(
        sa.literal_column(str(POOL_LEASE_LOCK)), sa.func.hashtext(pool_id)
    )


async def wait_for_pool_lease(conn: AsyncConnection, pool_id: str) -> None:
    """Wait for the pool's lease and hold it for the rest of the transaction (re-taking one held is a
    no-op): ``SELECT pg_advisory_xact_lock(POOL_LEASE_LOCK, hashtext(:pool_id))``. Second in the lock
    order: the transaction holds no row lock but its own reservation rows when it waits."""
    await conn.execute(
        sa.select(
            sa.func.pg_advisory_xact_lock(sa.literal_column(str(POOL_LEASE_LOCK)), sa.func.hashtext(pool_id))
        )
    )


def pool_not_found(pool_id: str) -> NotFound:
    """The one 404 of a pool id that names nothing: ``pool '<id>' not found``."""
    return NotFound(f"pool {quote_input(pool_id)} not found")


def node_not_found(node_id: str) -> NotFound:
    """The one 404 of a node id that names nothing: ``node '<id>' not found``."""
    return NotFound(f"node {quote_input(node_id)} not found")


# built once (bind parameters only): SQLAlchemy memoizes a construct's cache key, so a call costs a
# compiled-cache lookup, not a new construct and its cache key (issue 15)
_POOL_BY_ID = sa.select(pools).where(pools.c.id == sa.bindparam("pool_id", type_=sa.Text))
_LOCK_POOL_FOR_UPDATE = _POOL_BY_ID.with_for_update(key_share=True)  # FOR NO KEY UPDATE
_LOCK_POOL_FOR_SHARE = _POOL_BY_ID.with_for_update(read=True)
# the placing transactions' FOR SHARE, run prepared: it is on every inline create's path
_SHARE_POOL = Prepared(
    sa.select(pools.c.archived_at)
    .where(pools.c.id == sa.bindparam("pool_id", type_=sa.Text))
    .with_for_update(read=True)
)
# a deleted node (``deleted_at`` set: history only) is no node to read or lock: 404 like an unknown id
_LIVE_NODE = (nodes.c.id == sa.bindparam("node_id", type_=sa.Text), nodes.c.deleted_at.is_(None))
_NODE = sa.select(nodes).where(*_LIVE_NODE)
_LOCK_NODE = _NODE.with_for_update()
_NODE_POOL = sa.select(nodes.c.pool_id).where(*_LIVE_NODE)


async def lock_reservation(
    conn: AsyncConnection, reservation_id: str, *, placed_only: bool = False, skip_locked: bool = False
) -> Any | None:
    """Lock the reservation row ``FOR UPDATE`` and return it, first in the lock order; None when it is
    absent, not ``placed`` (``placed_only``) or, with ``skip_locked``, held by another transaction (a
    controller's claim: replica-safe, it never waits)::

        SELECT * FROM reservations WHERE id = :reservation_id [AND status = 'placed']
           FOR UPDATE [SKIP LOCKED]

    PostgreSQL re-checks ``status`` on a row it waited for, so a row released meanwhile is not returned."""
    stmt = sa.select(reservations).where(reservations.c.id == reservation_id)
    if placed_only:
        stmt = stmt.where(reservations.c.status == "placed")
    return (await conn.execute(stmt.with_for_update(skip_locked=skip_locked))).first()


async def lock_pool(conn: AsyncConnection, pool_id: str, *, for_update: bool = True) -> Any:
    """Lock the pool row and return it (``for_update=False``: ``FOR SHARE``); NotFound if absent.

    ``SELECT * FROM pools WHERE id = :pool_id FOR NO KEY UPDATE`` (or ``FOR SHARE``): after the
    reservation row and the pool lease in the lock order. ``FOR NO KEY UPDATE`` conflicts with every
    ``FOR SHARE`` (the commits in flight) but not with the foreign keys' ``FOR KEY SHARE`` (the rows
    that name the pool, e.g. a create's reservation row while it plans)."""
    stmt = _LOCK_POOL_FOR_UPDATE if for_update else _LOCK_POOL_FOR_SHARE
    row = (await conn.execute(stmt, {"pool_id": pool_id})).first()
    if row is None:
        raise pool_not_found(pool_id)
    return row


async def lock_node(conn: AsyncConnection, node_id: str) -> Any:
    """Lock the node row and return it; NotFound if absent.

    ``SELECT * FROM nodes WHERE id = :node_id FOR UPDATE``: the caller holds its pool row already when it
    needs one (:func:`lock_node_in_order`)."""
    row = (await conn.execute(_LOCK_NODE, {"node_id": node_id})).first()
    if row is None:
        raise node_not_found(node_id)
    return row


async def lock_node_in_order(conn: AsyncConnection, node_id: str) -> Any:
    """Lock the node's pool row ``FOR SHARE``, then the node row ``FOR UPDATE`` (the lock order), and
    return the node row; NotFound if the node is absent.

    :func:`pool_of_node` (no lock: a node never changes pool), then :func:`lock_pool` ``FOR SHARE`` and
    :func:`lock_node`."""
    await lock_pool(conn, await pool_of_node(conn, node_id), for_update=False)
    return await lock_node(conn, node_id)


async def node_row(conn: AsyncConnection, node_id: str) -> Any:
    """The node row, no lock (``SELECT * FROM nodes WHERE id = :node_id``); NotFound if absent."""
    row = (await conn.execute(_NODE, {"node_id": node_id})).first()
    if row is None:
        raise node_not_found(node_id)
    return row


async def pool_of_node(conn: AsyncConnection, node_id: str) -> str:
    """The pool a node belongs to, no lock (``SELECT pool_id FROM nodes WHERE id = :node_id``: a node never
    changes pool); NotFound if absent."""
    pool_id = (await conn.execute(_NODE_POOL, {"node_id": node_id})).scalar()
    if pool_id is None:
        raise node_not_found(node_id)
    return str(pool_id)


class PoolShare:
    """The pool row's ``FOR SHARE`` of one placing transaction, taken right before its first guarded
    commit (docs/placement-rules.md, "The pipeline": the critical section is the commit alone) and held
    to its end.

    :meth:`take` locks once (``SELECT archived_at FROM pools WHERE id = :pool_id FOR SHARE``, prepared)
    and answers whether the pool may still be placed into: False when it was archived, however long
    before (an archive holds ``FOR NO KEY UPDATE``, so it committed before the lock or waits for this
    transaction). Later calls answer the same without a round trip. The inline create, the batch, a wake
    and preemption share one per transaction."""

    __slots__ = ("pool_id", "held", "archived")

    def __init__(self, pool_id: str) -> None:
        self.pool_id = pool_id
        self.held = False
        self.archived = False

    async def take(self, conn: AsyncConnection) -> bool:
        """Lock the pool row ``FOR SHARE`` (the first time only); True while it is not archived."""
        if not self.held:
            pool = (await _SHARE_POOL.run(conn, {"pool_id": self.pool_id})).first()
            if pool is None:
                raise pool_not_found(self.pool_id)
            self.held = True
            self.archived = pool.archived_at is not None
        return not self.archived
