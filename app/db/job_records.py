"""Stored job records (docs/explain.md): the rows behind ``vq.job-history/1``.

Plain storage: a record is a JSON object keyed by its job id, with the target it ran on as a column for
the filter; a newer record of the same job replaces the older one. What a record is (its validation, the
document around the rows) is the fleet's: ``app.fleet.history`` (``stored_record``,
``job_history_document``). This module imports no domain module.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.tables import fleet_job_records
from app.db.tx import reads, transaction


@transaction
async def record_job(conn: AsyncConnection, job_id: str, target: str, record: dict[str, Any]) -> None:
    """Insert or replace the record of ``job_id`` (``target``: its target, ``""`` when none); given the
    engine it opens its own transaction (:func:`app.db.tx.transaction`)."""
    # INSERT INTO fleet_job_records (id, target, record) VALUES (...)
    #   ON CONFLICT (id) DO UPDATE SET target = excluded.target, record = excluded.record, recorded_at = now()
    stmt = pg_insert(fleet_job_records).values(id=job_id, target=target, record=record)
    await conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["id"],
            set_={
                "target": stmt.excluded.target,
                "record": stmt.excluded.record,
                "recorded_at": sa.func.now(),
            },
        )
    )


@reads
async def job_records(
    conn: AsyncConnection, kind: str | None = None, target: str | None = None, limit: int = 10_000
) -> list[dict[str, Any]]:
    """The stored records (newest recorded first, then by id), filtered by the record's ``kind`` and by
    ``target``; at most ``limit``."""
    # SELECT record FROM fleet_job_records [WHERE record->>'kind' = :kind] [AND target = :target]
    #   ORDER BY recorded_at DESC, id LIMIT :limit
    stmt = sa.select(fleet_job_records.c.record).order_by(
        fleet_job_records.c.recorded_at.desc(), fleet_job_records.c.id
    )
    if kind is not None:
        stmt = stmt.where(fleet_job_records.c.record["kind"].astext == kind)
    if target is not None:
        stmt = stmt.where(fleet_job_records.c.target == target)
    return list((await conn.execute(stmt.limit(limit))).scalars().all())
