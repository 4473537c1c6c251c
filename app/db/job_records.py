"""Stored job records (seed 004, "Queue history"): this service keeps the job records that the fleet
build's queue-history rule and ``placement compare`` read, as ``vq.job-history/1`` documents.

Records are kept as validated JSON (``app.fleet.history.JobRecord``) keyed by ``job_id``; a newer record
of the same job replaces the older one. Times stay text on purpose: unparsable or backwards times are
excluded by the history rule, not refused here.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.tables import fleet_job_records
from app.db.tx import reads, transaction
from app.fleet.history import JOB_HISTORY_SCHEMA, JobRecord


@transaction
async def record_job(conn: AsyncConnection, record: JobRecord) -> dict[str, Any]:
    """Insert or replace the record of ``record.job_id``; returns the stored JSON."""
    data = record.model_dump(mode="json", exclude_none=True)
    # INSERT INTO fleet_job_records (id, target, record) VALUES (...)
    #   ON CONFLICT (id) DO UPDATE SET target = excluded.target, record = excluded.record, recorded_at = now()
    stmt = pg_insert(fleet_job_records).values(id=record.job_id, target=record.target or "", record=data)
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
    return data


@reads
async def job_history(
    conn: AsyncConnection, kind: str | None = None, target: str | None = None, limit: int = 10_000
) -> dict[str, Any]:
    """``vq.job-history/1`` of the stored records (newest recorded first), filtered by kind and target."""
    stmt = sa.select(fleet_job_records.c.record).order_by(
        fleet_job_records.c.recorded_at.desc(), fleet_job_records.c.id
    )
    if kind is not None:
        stmt = stmt.where(fleet_job_records.c.record["kind"].astext == kind)
    if target is not None:
        stmt = stmt.where(fleet_job_records.c.target == target)
    rows = (await conn.execute(stmt.limit(limit))).scalars().all()
    return {"schema_name": JOB_HISTORY_SCHEMA, "jobs": list(rows)}
