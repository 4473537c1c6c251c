"""The audit log's service: finishing a request's record, reading the log, pruning it
(docs/operating.md, "Audit log").

The row of a request that committed a change is written in that change's transaction
(:mod:`app.db.audit`); :func:`finish` completes the record once the answer's status is known, with at
most one statement of its own (autocommit, prepared), none for a success that changed nothing (a quiet
heartbeat: :func:`app.db.audit.note_unchanged`). :func:`list_events` pages the log newest first and
:func:`prune` deletes what is older than the retention (a lifecycle task, safe with several replicas).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.answers.audit import AuditActor, AuditEvent
from app.db.audit import INSERT, SET_STATUS, AuditContext
from app.db.tables import audit_events
from app.db.tx import reads
from app.observability.metrics import AUDIT_EVENTS, AUDIT_WRITE_FAILURES

log = logging.getLogger("better_compute.audit")

PRUNE_AUDIT = "prune-audit"  # the lifecycle task
AUDIT_PRUNE_SECONDS = 3600.0  # how often it runs
RATE_LIMITED = 429  # refused before anything was looked at: not recorded (a flood would write a row each)


async def _autocommit(engine: AsyncEngine) -> AsyncConnection:
    conn = await engine.connect()
    return await conn.execution_options(isolation_level="AUTOCOMMIT")


async def finish(engine: AsyncEngine, context: AuditContext, status: int) -> None:
    """Complete ``context``'s record for an answer of ``status``: nothing when its transaction wrote that
    status already; ``UPDATE ... SET status`` when it wrote another (an idempotent retry's 200, a queued
    202, a step after the commit that failed), or an INSERT when that row is missing; an INSERT when no
    transaction committed (refused before any write, or rolled back). Not recorded: a 429 without a
    row, and a success whose service changed nothing (:func:`app.db.audit.note_unchanged`: a heartbeat
    that only recorded its time). One statement at most, in autocommit; a failure is logged and counted
    (``bc_audit_write_failures_total``), never raised: the answer has been given."""
    if context.row_id is not None and context.written_status == status:
        AUDIT_EVENTS.labels(outcome_class(status)).inc()
        return
    if context.row_id is None and (
        status == RATE_LIMITED or (context.unchanged and status == context.success_status)
    ):
        return
    try:
        conn = await _autocommit(engine)
        try:
            if context.row_id is not None:
                params = {"row_id": context.row_id, "status": status}
                updated = await SET_STATUS.run(conn, params)
                if updated.rowcount == 1:
                    AUDIT_EVENTS.labels(outcome_class(status)).inc()
                    return
            else:  # nothing committed: an id noted in a transaction that rolled back names nothing
                context.created_id = None
            await INSERT.run(conn, context.row(status))
        finally:
            await conn.close()
    except Exception:  # a database outage (the answer was a 503 too) or a bug: the log says which
        AUDIT_WRITE_FAILURES.inc()
        log.exception("audit row of %s %s not written", context.method, context.route)
        return
    AUDIT_EVENTS.labels(outcome_class(status)).inc()


def outcome_class(status: int) -> str:
    """``2xx``, ``3xx``, ``4xx`` or ``5xx`` (the metric's label)."""
    return f"{min(max(status // 100, 2), 5)}xx"


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """``since`` (inclusive) and ``until`` (exclusive) bound ``at``; ``actor`` matches the key id or the
    principal's name; ``resource`` any of the path parameters' values or the created id."""

    since: datetime | None = None
    until: datetime | None = None
    actor: str | None = None
    resource: str | None = None


@dataclass(frozen=True, slots=True)
class AuditPage:
    """A page of events and the sort key ``(at, id)`` after its last one, None on the last page."""

    items: list[AuditEvent]
    next: tuple[str, str] | None


def _event(row: sa.Row) -> AuditEvent:
    return AuditEvent(
        id=row.id,
        at=row.at.isoformat(),
        requestId=row.request_id,
        actor=AuditActor(keyId=row.key_id, principal=row.principal, role=row.role, tenantId=row.tenant_id),
        operationId=row.operation_id,
        method=row.method,
        route=row.route,
        pathParams=dict(row.path_params),
        createdId=row.created_id,
        resources=list(row.resources),
        status=row.status,
    )


@reads
async def list_events(
    conn: AsyncConnection, where: AuditFilter, limit: int, after: tuple[datetime, str] | None = None
) -> AuditPage:
    """Up to ``limit`` events matching ``where``, newest first (``at`` then ``id`` descending), after the
    sort key ``after`` (the previous page's last ``(at, id)``)."""
    # SELECT * FROM audit_events WHERE [at >= :since] [AND at < :until]
    #   [AND (key_id = :actor OR principal = :actor)] [AND resources @> ARRAY[:resource]]
    #   [AND (at, id) < (:at, :id)] ORDER BY at DESC, id DESC LIMIT :limit + 1
    t = audit_events
    stmt = sa.select(t).order_by(t.c.at.desc(), t.c.id.desc()).limit(limit + 1)
    if where.since is not None:
        stmt = stmt.where(t.c.at >= where.since)
    if where.until is not None:
        stmt = stmt.where(t.c.at < where.until)
    if where.actor is not None:
        stmt = stmt.where(sa.or_(t.c.key_id == where.actor, t.c.principal == where.actor))
    if where.resource is not None:
        stmt = stmt.where(t.c.resources.contains(sa.cast([where.resource], t.c.resources.type)))
    if after is not None:
        stmt = stmt.where(sa.tuple_(t.c.at, t.c.id) < sa.tuple_(sa.literal(after[0], t.c.at.type), after[1]))
    rows = (await conn.execute(stmt)).all()
    items = [_event(row) for row in rows[:limit]]
    following = (items[-1].at, items[-1].id) if len(rows) > limit else None
    return AuditPage(items, following)


async def prune(engine: AsyncEngine, retention: timedelta, now: datetime | None = None) -> int:
    """Delete the events older than ``retention`` before ``now`` (default: the database clock); returns
    how many. One statement, idempotent: replicas pruning at once delete each row once between them."""
    # DELETE FROM audit_events WHERE at < coalesce(:now, now()) - :retention
    cutoff = (sa.literal(now, audit_events.c.at.type) if now is not None else sa.func.now()) - retention
    conn = await _autocommit(engine)
    try:
        result = await conn.execute(sa.delete(audit_events).where(audit_events.c.at < cutoff))
    finally:
        await conn.close()
    return result.rowcount
