"""The outermost middleware (pure ASGI): a request id, one access-log line and the HTTP metrics for every
request, and the one place an unexpected error is logged and answered 500.

Order in the app (outermost first): this middleware, CORS, authentication and body limits, then
Starlette's exception middleware and the routes. Being outermost, it sees every answer, those of the
middlewares inside it (401, 413, 429, a CORS preflight) as well as the routes'.

- ``X-Request-Id``: the client's value when it is 1..128 characters of ``[A-Za-z0-9._:=+/-]`` starting with
  a letter or digit (anything else could forge or break a log line: a fresh id replaces it), else a new
  ``req_<ulid>``. It is returned on every response and set in ``scope["state"]["request_id"]`` and in the
  logging context (:data:`app.observability.logs.REQUEST_ID`).
- The access line: method, route template (``/v1/reservations/{reservation_id}``, never the raw path;
  ``unmatched`` when no route matches), status, duration in ms, key id
  (``scope["state"]["api_key_id"]``, set by the authentication middleware; ``-`` without one) and
  request id.
- A client that goes away before its body is complete (``http.disconnect`` while the request guard or a
  route reads the body: :func:`mark_client_gone`, or Starlette's ``ClientDisconnect``) is status 499
  (nginx's "client closed request") in the access line and the metrics, without a traceback: nothing
  failed on the server's side, and no answer is sent.
- An exception that escapes the app is logged here once, with its traceback and the request id, and
  answered ``500 INTERNAL`` in the one error shape; it is not re-raised, so neither Starlette's
  ServerErrorMiddleware nor the server logs it a second time.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from fastapi.routing import iter_route_contexts
from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import AppError
from app.ids import new_id
from app.observability import metrics
from app.observability.logs import LOGGER, REQUEST_ID

REQUEST_ID_HEADER = "X-Request-Id"
NO_KEY = "-"  # the key id of a request no key authenticated
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:=+/-]{0,127}")
CLIENT_CLOSED_REQUEST = 499  # the status logged and counted for a client gone before its body ended
_CLIENT_GONE = "client_gone"  # scope["state"] flag set by mark_client_gone

access_log = logging.getLogger(f"{LOGGER}.access")
error_log = logging.getLogger(f"{LOGGER}.error")


def request_id_of(headers: Headers) -> str:
    """The client's ``X-Request-Id`` when it is well-formed (see the module docstring), else a new id."""
    given = headers.get(REQUEST_ID_HEADER)
    if given is not None and REQUEST_ID_PATTERN.fullmatch(given):
        return given
    return new_id("req")


def mark_client_gone(scope: Scope) -> None:
    """Record that the client disconnected before its request was complete (no answer will be sent):
    the access line and the metrics then say 499, not 500."""
    scope.setdefault("state", {})[_CLIENT_GONE] = True


@dataclass(frozen=True, slots=True)
class RouteTemplate:
    """One route's template (``path_format``, include prefixes in it), its path regex and methods."""

    template: str
    pattern: re.Pattern[str]
    methods: frozenset[str]


def route_templates(routes: Sequence[BaseRoute]) -> list[RouteTemplate]:
    """The app's routes (included routers flattened, in the router's order) as :class:`RouteTemplate`."""
    out = []
    for route in iter_route_contexts(routes):
        if route.path_format:  # matched on the path with its convertors: {path:path} takes slashes
            pattern, _, _ = compile_path(route.path or route.path_format)
            out.append(RouteTemplate(route.path_format, pattern, frozenset(route.methods or ())))
    return out


def route_template(scope: Scope, templates: Sequence[RouteTemplate]) -> str:
    """The template of the route the router picks for ``scope``: the first whose path and method match,
    else the first whose path matches (a 405), else ``unmatched``. Matched here rather than read from
    ``scope["route"]``, so answers given before routing (a 401, a 413) are labelled too."""
    path, method = scope["path"], scope["method"]
    partial: str | None = None
    for t in templates:
        if t.pattern.match(path):
            if not t.methods or method in t.methods:
                return t.template
            partial = partial or t.template
    return partial or metrics.UNMATCHED_ROUTE


class AccessLogMiddleware:
    """Request id, access log, HTTP metrics and the 500 of an unexpected error (module docstring).
    ``routes`` are the app's routes (``app.routes``; included routers are flattened)."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.templates = route_templates(routes)
        metrics.declare_routes(t.template for t in self.templates)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = request_id_of(Headers(scope=scope))
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        token = REQUEST_ID.set(request_id)
        status: int | None = None

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
            await send(message)

        method = scope["method"]
        route = route_template(scope, self.templates)  # before the app runs: a Mount rewrites the path
        try:
            await self.app(scope, receive, send_with_id)
        except ClientDisconnect:  # a route read a body the client stopped sending
            mark_client_gone(scope)
        except Exception:
            error_log.exception("unhandled error in %s %s", method, route, extra={"request_id": request_id})
            if status is None:  # nothing sent yet: answer in the one error shape
                response = JSONResponse(AppError("internal error").to_body(), status_code=500)
                await response(scope, receive, send_with_id)
            # else: the answer had started; the client sees a cut response, the log has the traceback
        finally:
            REQUEST_ID.reset(token)
        seconds = time.perf_counter() - started
        if status is not None:
            code = status
        else:
            code = CLIENT_CLOSED_REQUEST if state.get(_CLIENT_GONE) else 500
        metrics.observe_http(route, method, code, seconds)
        key_id = state.get("api_key_id") or NO_KEY
        access_log.info(
            "%s %s %d %.1fms key=%s",
            method,
            route,
            code,
            seconds * 1000,
            key_id,
            extra={
                "request_id": request_id,
                "method": method,
                "route": route,
                "status": code,
                "duration_ms": round(seconds * 1000, 3),
                "key_id": key_id,
            },
        )
