"""Reservation rows in and out for the batch paths (pool-lease queue, bulk create): the multi-row
insert with idempotency, and the multi-row status update of decided reservations (docs/placement-rules.md;
the inline
create of :mod:`app.capacity.reservations.create` writes its single row itself)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from app.answers.reservations import Condition
from app.capacity.conditions import stored
from app.capacity.requests import row_values, spec_hash
from app.db.prepared import Prepared
from app.db.tables import TS, pools, reservations
from app.db.unnest import bound_rows
from app.errors import AppError, IdempotencyKeyReused, NotFound, quote_input
from app.ids import new_id
from app.placement.request import ReservationRequest


@dataclass(frozen=True, slots=True)
class Written:
    """One body's row: ``row`` (the reservation as stored) and ``created`` (False: an idempotent retry
    answered by the row made before), or ``error`` (nothing was written for it)."""

    row: Any = None
    created: bool = False
    error: AppError | None = None


async def insert_reservations(
    conn: AsyncConnection, bodies: list[ReservationRequest], status: str = "pending"
) -> list[Written]:
    """Insert a row per body in one statement, ``status`` set, with ``ON CONFLICT (tenant_id,
    idempotency_key) DO NOTHING``; a body whose key was used answers the earlier row when its spec is
    the same, else ``IDEMPOTENCY_KEY_REUSED``; a body naming no existing pool is ``NOT_FOUND``. Several
    bodies of one call with one key: the first is written, the others are its retries."""
    known = await _existing_pools(conn, {b.poolId for b in bodies})
    out: list[Written | None] = [None] * len(bodies)
    values: list[dict[str, Any]] = []
    for i, b in enumerate(bodies):
        if b.poolId not in known:
            out[i] = Written(error=NotFound(f"pool {quote_input(b.poolId)} not found"))
            continue
        spec = b.spec()
        values.append({"id": new_id("res"), "status": status, **row_values(b, spec, spec_hash(spec))})
    inserted: dict[str, Any] = {}
    if values:
        # INSERT INTO reservations (id, tenant_id, pool_id, status, spec, spec_hash, idempotency_key,
        #   deadline) VALUES (...), ... ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING *
        rows = (
            await conn.execute(
                pg_insert(reservations)
                .values(values)
                .on_conflict_do_nothing(index_elements=["tenant_id", "idempotency_key"])
                .returning(*reservations.c)
            )
        ).all()
        inserted = {r.id: r for r in rows}
    by_key = {(r.tenant_id, r.idempotency_key): r for r in inserted.values()}
    missing = {(b.tenantId, b.idempotencyKey) for i, b in enumerate(bodies) if out[i] is None} - set(by_key)
    earlier = await _rows_by_key(conn, missing)
    claimed: set[str] = set()
    for i, b in enumerate(bodies):
        if out[i] is not None:
            continue
        row = by_key.get((b.tenantId, b.idempotencyKey)) or earlier.get((b.tenantId, b.idempotencyKey))
        assert row is not None
        if row.spec_hash != spec_hash(b.spec()):
            out[i] = Written(
                error=IdempotencyKeyReused(
                    f"idempotency key {b.idempotencyKey} was used with another body",
                    {"idempotencyKey": b.idempotencyKey, "reservationId": row.id},
                )
            )
            continue
        created = row.id in inserted and row.id not in claimed
        claimed.add(row.id)
        out[i] = Written(row, created)
    return [w for w in out if w is not None]


async def _existing_pools(conn: AsyncConnection, pool_ids: set[str]) -> set[str]:
    # SELECT id FROM pools WHERE id = ANY(:ids)
    rows = await conn.execute(sa.select(pools.c.id).where(pools.c.id.in_(sorted(pool_ids))))
    return set(rows.scalars())


async def _rows_by_key(conn: AsyncConnection, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Any]:
    wanted = sorted(keys)
    if not wanted:
        return {}
    # SELECT * FROM reservations WHERE (tenant_id, idempotency_key) IN ((:t, :k), ...)
    rows = await conn.execute(
        sa.select(reservations).where(
            sa.tuple_(reservations.c.tenant_id, reservations.c.idempotency_key).in_(wanted)
        )
    )
    return {(r.tenant_id, r.idempotency_key): r for r in rows.all()}


@dataclass(frozen=True, slots=True)
class Decision:
    """What became of one reservation: its new ``status``, ``conditions`` and ``ends_at``."""

    reservation_id: str
    status: str
    conditions: list[Condition]
    ends_at: datetime | None = None


def decided_update() -> sa.Update:
    """The UPDATE of :func:`mark_decided`, without RETURNING, from the bind parameters of
    :func:`decided_params` (the queue worker sends its NOTIFY in the same statement)."""
    # UPDATE reservations SET status = d.status, conditions = d.conditions::jsonb, ends_at = d.ends_at,
    #        updated_at = now()
    #   FROM unnest(:ids, :statuses, :conditions, :ends_at) AS d (id, status, conditions, ends_at)
    #  WHERE reservations.id = d.id
    decided = bound_rows(
        "decided",
        ("id", "ids", sa.Text),
        ("status", "statuses", sa.Text),
        ("conditions", "conditions", sa.Text),  # JSON texts: cast in the SET
        ("ends_at", "ends_at", TS),
    )
    return (
        sa.update(reservations)
        .where(reservations.c.id == decided.c.id)
        .values(
            status=decided.c.status,
            conditions=sa.cast(decided.c.conditions, JSONB),
            ends_at=decided.c.ends_at,
            updated_at=sa.func.now(),
        )
    )


def decided_params(decisions: list[Decision]) -> dict[str, Any]:
    """The bind parameters of :func:`decided_update` for ``decisions``."""
    return {
        "ids": [d.reservation_id for d in decisions],
        "statuses": [d.status for d in decisions],
        "conditions": [json.dumps(stored(d.conditions)) for d in decisions],
        "ends_at": [d.ends_at for d in decisions],
    }


# ... RETURNING reservations.*
MARK_DECIDED = Prepared(decided_update().returning(*reservations.c))


async def mark_decided(conn: AsyncConnection, decisions: list[Decision]) -> dict[str, Any]:
    """Write every decision in one statement (:data:`MARK_DECIDED`, prepared: one compiled text for any
    number of decisions); returns reservation id -> the updated row."""
    if not decisions:
        return {}
    rows = await MARK_DECIDED.run(conn, decided_params(decisions))
    return {r.id: r for r in rows.all()}


async def delete_unwritten(conn: AsyncConnection, reservation_ids: list[str]) -> None:
    """Remove rows inserted for bodies that failed afterwards (bad start, over quota): for them
    nothing changed."""
    if reservation_ids:
        # DELETE FROM reservations WHERE id = ANY(:ids)
        await conn.execute(sa.delete(reservations).where(reservations.c.id.in_(reservation_ids)))
