"""CORS for browser dashboards on other origins (``BC_CORS_ORIGINS``; off when the list is empty).

Starlette's CORSMiddleware answers the preflight of an allowed origin (methods the API uses, the
``Authorization`` and ``Content-Type`` request headers, ``X-Request-Id`` both ways) and adds
``Access-Control-Allow-Origin`` to its responses. A request from any other origin passes through
untouched, with no CORS header at all (Starlette alone would still add ``Access-Control-Allow-Methods``
and friends to such a preflight's 400): for that browser the API is simply not shared, and its
preflight reaches the request guard as an ``OPTIONS`` without a key (401). A preflight of an allowed
origin asking for a method or request header the API does not allow is 422 ``INVALID_INPUT`` in the
one error shape, naming the preflight header (Starlette alone answers a plain-text 400). Keys travel in
``Authorization``, not cookies, so credentials mode stays off.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import InvalidInput, clip_input

ALLOWED_METHODS = ("GET", "POST", "PUT", "DELETE")
ALLOWED_HEADERS = ("Authorization", "Content-Type", "X-Request-Id")
EXPOSED_HEADERS = ("X-Request-Id", "Retry-After")
PREFLIGHT_MAX_AGE = 600  # seconds a browser may cache a preflight answer


class BrowserCors(CORSMiddleware):
    """CORS for exactly ``origins`` (e.g. ``["https://dash.example.com"]``); see the module docstring."""

    def __init__(self, app: ASGIApp, origins: Sequence[str]) -> None:
        super().__init__(
            app,
            allow_origins=list(origins),
            allow_methods=list(ALLOWED_METHODS),
            allow_headers=list(ALLOWED_HEADERS),
            expose_headers=list(EXPOSED_HEADERS),
            allow_credentials=False,
            max_age=PREFLIGHT_MAX_AGE,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            origin = Headers(scope=scope).get("origin")
            if origin is not None and not self.is_allowed_origin(origin):
                await self.app(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    def preflight_response(self, request_headers: Headers) -> Response:
        """Starlette's answer, except a refused preflight: 422 ``INVALID_INPUT`` naming the preflight
        header that asked for too much (``Access-Control-Request-Headers``, ``-Method`` or
        ``-Private-Network``), with the allowed values in ``details``."""
        answer = super().preflight_response(request_headers)
        if answer.status_code < 400:
            return answer
        error = self._refusal(request_headers)
        kept = {k: v for k, v in answer.headers.items() if k.startswith("access-control-") or k == "vary"}
        return JSONResponse(error.to_body(), status_code=error.status, headers=kept)

    def _refusal(self, request_headers: Headers) -> InvalidInput:
        requested = request_headers.get("access-control-request-headers") or ""
        refused = [h.strip() for h in requested.split(",") if h.strip().lower() not in self.allow_headers]
        method = request_headers.get("access-control-request-method", "")
        if refused:
            path, what, allowed = "Access-Control-Request-Headers", ", ".join(refused), ALLOWED_HEADERS
        elif method not in self.allow_methods:
            path, what, allowed = "Access-Control-Request-Method", method, ALLOWED_METHODS
        else:
            path, what, allowed = "Access-Control-Request-Private-Network", "private network access", ()
        message = f"{path}: {clip_input(what)} is not allowed"
        return InvalidInput(message, path=path, details={"allowed": list(allowed)})
