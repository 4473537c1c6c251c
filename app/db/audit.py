"""The audit row of a request, written in the change's own transaction (docs/operating.md, "Audit log").

The audit middleware (:mod:`app.api.audit_trail`) puts an :class:`AuditContext` in :data:`CURRENT` for
every mutating ``/v1/`` request. Every engine this service makes listens for commits (:func:`install`):
the first transaction a request commits inserts the request's row (:data:`INSERT`, one prepared
statement) right before its ``COMMIT``, so the change and its record commit together and a rolled-back
change (a 409, a lost race, an error) leaves no row from its transaction. No route or service does
anything for it: a route added later is recorded the same way.

The row written there carries the route's declared success status (201 for a create), the path
parameters and, for a create, the new resource's id (:func:`note_answer`, :func:`note_created`). The
middleware finishes the record once the answer is known (:func:`app.iam.audit_log.finish`): nothing more
when the answer's status is the one written (the common case), an UPDATE of the status when it differs
(an idempotent retry's 200, a queued 202, a later step that failed), or its own INSERT when no
transaction committed (a 401, 403, 404 or 422 refused before any write, a 409 rolled back).

A request whose service changed nothing an operator sees says so (:func:`note_unchanged`): its success
writes no row. One service does: a heartbeat that only recorded its time (same device health, same
readiness, no condition cleared; :func:`app.inventory.hello.heartbeat`), about a thousand a second at
10,000 nodes; a heartbeat that changes something writes its row as any change does.

This module imports no domain module: who the caller is comes from :attr:`AuditContext.actor`, a
function the middleware gives.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.prepared import Prepared
from app.db.tables import audit_events
from app.ids import new_id

CREATED = 201  # a route that declares it answers a created resource: its id is recorded


@dataclass(frozen=True, slots=True)
class Actor:
    """Who called: the key id (``bootstrap`` for the bootstrap admin key; None without a key), the
    principal's name, its role (``admin``, ``tenant``, ``agent``, ``key`` or ``anonymous``) and the
    key's tenant (None for an untenanted key)."""

    key_id: str | None
    principal: str | None
    role: str
    tenant_id: str | None


ANONYMOUS = Actor(None, None, "anonymous", None)


@dataclass(slots=True)
class AuditContext:
    """One mutating request being recorded: what (``operation_id``, ``method``, ``route`` template,
    ``path_params``), the status the route declares for success, who (``actor()``, read when the row is
    written: the request guard authenticates after the context is made), the request id, and what was
    written so far (``row_id``, ``written_status``: None until a row exists)."""

    operation_id: str
    method: str
    route: str
    path_params: dict[str, str]
    success_status: int
    actor: Callable[[], Actor] = lambda: ANONYMOUS
    request_id: str | None = None
    created_id: str | None = None
    row_id: str | None = None
    written_status: int | None = None
    answered_status: int | None = None  # the status the service knows it answers, when not the declared one
    unchanged: bool = False  # the service changed nothing an operator sees: a success writes no row

    def row(self, status: int) -> dict[str, Any]:
        """The bind parameters of :data:`INSERT` for this request answered ``status`` (a new id)."""
        who = self.actor()
        resources = list(self.path_params.values())
        if self.created_id is not None and self.created_id not in resources:
            resources.append(self.created_id)
        return {
            "id": new_id("aud"),
            "request_id": self.request_id,
            "key_id": who.key_id,
            "principal": who.principal,
            "role": who.role,
            "tenant_id": who.tenant_id,
            "operation_id": self.operation_id,
            "method": self.method,
            "route": self.route,
            "path_params": self.path_params,
            "created_id": self.created_id,
            "resources": resources,
            "status": status,
        }


CURRENT: ContextVar[AuditContext | None] = ContextVar("audit_context", default=None)

_COLUMNS = (
    "id",
    "request_id",
    "key_id",
    "principal",
    "role",
    "tenant_id",
    "operation_id",
    "method",
    "route",
    "path_params",
    "created_id",
    "resources",
    "status",
)
# INSERT INTO audit_events (id, request_id, key_id, principal, role, tenant_id, operation_id, method,
#   route, path_params, created_id, resources, status) VALUES ($1, ..., $13)   -- at: now()
INSERT = Prepared(sa.insert(audit_events).values({name: sa.bindparam(name) for name in _COLUMNS}))
# UPDATE audit_events SET status = $1 WHERE id = $2
SET_STATUS = Prepared(
    sa.update(audit_events)
    .where(audit_events.c.id == sa.bindparam("row_id"))
    .values(status=sa.bindparam("status"))
)


def note_answer(answer: Any) -> None:
    """Called by a unit of work (:func:`app.db.tx.in_transaction`) with its answer before its COMMIT: for
    a route that answers a created resource (201), the answer's ``id`` is the resource recorded."""
    context = CURRENT.get()
    if context is None or context.success_status != CREATED or context.created_id is not None:
        return
    created = getattr(answer, "id", None)
    if isinstance(created, str):
        context.created_id = created


def note_created(resource_id: str) -> None:
    """Record ``resource_id`` as the resource the current request creates (a service that opens its
    transaction itself and makes the id there, e.g. a reservation's create)."""
    context = CURRENT.get()
    if context is not None and context.success_status == CREATED and context.created_id is None:
        context.created_id = resource_id


def note_status(status: int) -> None:
    """Record, before COMMIT, the status the current request will answer when it is not the route's
    declared one (a queued create's 202): the row is written with it, and no UPDATE follows."""
    context = CURRENT.get()
    if context is not None:
        context.answered_status = status


def note_unchanged() -> None:
    """Record that the current request changed nothing an operator sees (a heartbeat that only recorded
    its time): answered with its success status, it is no audited change and writes no row
    (:func:`app.iam.audit_log.finish`). Called by the service that knows, after its last write."""
    context = CURRENT.get()
    if context is not None:
        context.unchanged = True


def _write_before_commit(conn: Connection) -> None:
    """The engine's ``commit`` listener: the current request's row, inserted in the transaction being
    committed, once per request (a request that commits several transactions records in the first)."""
    context = CURRENT.get()
    if context is None or context.row_id is not None:
        return
    status = context.answered_status or context.success_status
    row = context.row(status)
    sql, values = INSERT.arguments(conn.dialect, row)
    conn.exec_driver_sql(sql, values)
    context.row_id, context.written_status = row["id"], status


def install(engine: AsyncEngine) -> None:
    """Make every transaction ``engine`` commits write the current request's audit row (idempotent)."""
    if not event.contains(engine.sync_engine, "commit", _write_before_commit):
        event.listen(engine.sync_engine, "commit", _write_before_commit)
