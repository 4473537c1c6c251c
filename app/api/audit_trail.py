"""The audit middleware (pure ASGI): every mutating ``/v1/`` request gets one audit row
(docs/operating.md, "Audit log").

A request is recorded when its method is POST, PUT, PATCH or DELETE and it matches an operation of the
app's OpenAPI document (a route in the schema, by its ``operation_id``) that is not in
:data:`READ_ONLY_OPERATIONS`. The routes are
read from the app itself on the first request, so a route added later is recorded without anything
written for it here or in its service.

It sits outside the request guard: it sees the guard's 401, 403 and 413 as well as the routes' answers.
For each recorded request it puts an :class:`~app.db.audit.AuditContext` in
:data:`app.db.audit.CURRENT`; the first transaction the request commits inserts the row before its COMMIT
(:mod:`app.db.audit`), and after the answer :func:`app.iam.audit_log.finish` completes it (or writes it,
when nothing committed). The row's status is the answer's: a change that was rolled back (409, 412, 422
at intake) is recorded with that status, never with a success. A success whose service changed nothing
an operator sees (a heartbeat that only recorded its time: :func:`app.db.audit.note_unchanged`) writes
no row; its refusals (401, 403, 404, 422) are recorded as any.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi.routing import APIRoute, iter_route_contexts
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.guard import GUARDED_PREFIX, is_agent_key
from app.db.audit import ANONYMOUS, CURRENT, Actor, AuditContext
from app.iam.audit_log import finish
from app.iam.authorize import Principal, is_admin

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# POSTs that change nothing: they take a body too large or too structured for a query string
READ_ONLY_OPERATIONS: frozenset[str] = frozenset(
    {
        "previewCapacity",  # the placement pipeline without the commit
        "explainPlacement",  # where a calculation should run, from the documents in the body
        "comparePlacementOrderings",  # orderings compared on the body's documents
        "buildPlacementFleet",  # a fleet document built from the body's; nothing is stored
    }
)


@dataclass(frozen=True, slots=True)
class AuditedRoute:
    """A recorded operation: its path regex, method, template, operation id and success status."""

    pattern: re.Pattern[str]
    method: str
    template: str
    operation_id: str
    success_status: int


def audited_routes(routes: list[Any]) -> list[AuditedRoute]:
    """The app's mutating ``/v1/`` operations minus :data:`READ_ONLY_OPERATIONS`, in the router's order."""
    out = []
    for context in iter_route_contexts(routes):  # included routers flattened, prefixes in the template
        route, template = context.original_route, context.path_format
        if not isinstance(route, APIRoute) or not template or not template.startswith(GUARDED_PREFIX):
            continue
        if not route.include_in_schema:  # no operation of the document (e.g. a 405 of other methods)
            continue
        operation = route.operation_id or route.unique_id
        if operation in READ_ONLY_OPERATIONS:
            continue
        pattern = compile_path(context.path or template)[0]
        for method in sorted(set(context.methods or ()) & MUTATING):
            out.append(AuditedRoute(pattern, method, template, operation, route.status_code or 200))
    return out


def actor_of(principal: Principal | None) -> Actor:
    """Who a principal is in the log: its key, name, role and tenant."""
    if principal is None:
        return ANONYMOUS
    if is_admin(principal):
        role = "admin"
    elif principal.tenant_id is not None:
        role = "tenant"
    elif is_agent_key(principal):
        role = "agent"
    else:
        role = "key"
    return Actor(principal.key_id, principal.name, role, principal.tenant_id)


def _state_actor(state: dict[str, Any]) -> Callable[[], Actor]:
    def actor() -> Actor:
        principal = state.get("principal")
        return actor_of(principal if isinstance(principal, Principal) else None)

    return actor


CLIENT_GONE = 499


class AuditTrail:
    """The ASGI middleware of the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._routes: list[AuditedRoute] | None = None

    def _match(self, scope: Scope) -> tuple[AuditedRoute, dict[str, str]] | None:
        if self._routes is None:  # read once the app's routers are all included
            self._routes = audited_routes(list(scope["app"].routes))
        path, method = scope["path"], scope["method"]
        for route in self._routes:
            if route.method == method:
                matched = route.pattern.match(path)
                if matched is not None:
                    return route, matched.groupdict()
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] not in MUTATING
            or not scope["path"].startswith(GUARDED_PREFIX)
        ):
            await self.app(scope, receive, send)
            return
        found = self._match(scope)
        if found is None:  # no operation (the router's 404 or 405), or a read-only one
            await self.app(scope, receive, send)
            return
        route, params = found
        state = scope.setdefault("state", {})
        context = AuditContext(
            operation_id=route.operation_id,
            method=route.method,
            route=route.template,
            path_params=params,
            success_status=route.success_status,
            actor=_state_actor(state),
            request_id=state.get("request_id"),
        )
        status: int | None = None

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        token = CURRENT.set(context)
        try:
            await self.app(scope, receive, send_status)
        except Exception:  # answered 500 by the access-log middleware outside this one
            await finish(scope["app"].state.services.engine, context, status or 500)
            raise
        finally:
            CURRENT.reset(token)
        if status is None:  # the client went away before its body was complete: nothing was answered
            status = CLIENT_GONE
        await finish(scope["app"].state.services.engine, context, status)
