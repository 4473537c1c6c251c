"""CORS for browser dashboards on other origins (``BC_CORS_ORIGINS``; off when the list is empty).

Starlette's CORSMiddleware answers the preflight of an allowed origin (methods the API uses, the
``Authorization`` and ``Content-Type`` request headers, ``X-Request-Id`` both ways) and adds
``Access-Control-Allow-Origin`` to its responses. A request from any other origin passes through
untouched, with no CORS header at all (Starlette alone would still add ``Access-Control-Allow-Methods``
and friends to such a preflight's 400): for that browser the API is simply not shared, and a preflight
is an ``OPTIONS`` the API does not serve (405). Keys travel in ``Authorization``, not cookies, so
credentials mode stays off.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

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
