"""The request guard: a pure ASGI middleware that runs before routing and before any body is read.

For every ``/v1/...`` request, in this order (docs/api.md):

1. **Authenticate.** No ``Authorization: Bearer <key>`` or an unknown/revoked key answers 401
   ``UNAUTHENTICATED`` (an expired one: ``key expired``) whatever the body holds: the body is never
   read (uvicorn discards it). Failed
   authentications count against the client address (``BC_AUTH_FAILURE_RATE_LIMIT``, default
   10/second); over it, 429 ``RATE_LIMITED`` without even looking the key up, except for a key that
   authenticated in this process within the last :data:`RECENT_KEY_SECONDS` (:class:`RecentKeys`): one
   guesser behind a NAT or proxy does not lock out the valid keys sharing its address. The key is
   resolved to its :class:`~app.iam.authorize.Principal` with one query, whose answer the process keeps
   for ``BC_KEY_CACHE_SECONDS`` (2 s, :mod:`app.iam.key_cache`: a key revoked through this process stops
   at once, through another within those seconds; an expiring key is never served past its expiry),
   and kept in ``scope["state"]["principal"]`` for
   :func:`app.api.deps.current_principal`; ``scope["state"]["api_key_id"]`` is the key id
   (``"bootstrap"`` for the bootstrap admin key) for the access log. A database outage during the
   lookup answers 503 ``UNAVAILABLE`` with ``Retry-After``.
2. **Rate limit the key** (``BC_RATE_LIMIT``, default 100/second; ``BC_AGENT_RATE_LIMIT``, default
   5000/second, for an agent key, whose grants are all ``compute:nodes:hello``: a pool's agents share it):
   429 ``RATE_LIMITED`` with ``Retry-After``. The limit holds for the whole deployment: this process's
   moving window, then the deployment's window in PostgreSQL, taken in leases
   (:mod:`app.api.rate_limits`, which states how exact that is; ``BC_RATE_LIMIT_STORAGE=memory``: this
   process's count only, so N processes allow up to N times the limit).
3. **Refuse unstorable path and query text.** A NUL in the path names nothing: 404 ``NOT_FOUND``. A NUL
   (or a lone surrogate) in a query parameter is 422 ``INVALID_INPUT`` naming the parameter.
4. **Refuse a key without the route's grant, before the body.** A route that takes a body declares the
   action it needs (:mod:`app.api.route_grants`): on a resource from its path, checked as the route checks
   it, or on some resource when the resource is in the body or a row. A key that cannot hold it is 403
   ``FORBIDDEN`` without a byte of the body read (uvicorn then closes the connection instead of reading
   the rest), so a key without the grant cannot make the process buffer and parse a 24 MiB body. The
   route still authorizes itself: this is a necessary condition of its check, never a wider one.
5. **Bound the body before it is parsed.** ``Content-Length`` over the route's limit answers 413
   ``PAYLOAD_TOO_LARGE`` at once; a chunked body is read only up to the limit, then 413. The limit is
   ``BC_MAX_BODY_BYTES`` (1 MiB), except node import (``BC_MAX_IMPORT_BODY_BYTES``, 24 MiB: the
   ``nvidia-smi -q -x`` XML) and placement documents (``BC_MAX_PLACEMENT_BODY_BYTES``, 16 MiB: vq.*
   fleets). A body nested deeper than ``BC_MAX_JSON_DEPTH`` (64) arrays/objects is 422 before any JSON
   parser sees it, so body-less routes never parse a deep body either. The bounded body is then replayed
   to the app.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from cachetools import TTLCache
from starlette.responses import JSONResponse
from starlette.routing import compile_path

from app.api.rate_limits import RateLimits
from app.api.route_grants import ROUTE_GRANTS, RouteGrant
from app.api.text_guard import find_unstorable
from app.db.engine import is_outage
from app.errors import (
    AppError,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    Unauthenticated,
    Unavailable,
    clip_input,
)
from app.iam.authorize import Principal, authorize, holds_action, refusal_everywhere
from app.iam.keys import hash_key
from app.iam.service import KeyLookup, principal_for_key
from app.observability.metrics import GUARD_REFUSALS
from app.observability.middleware import mark_client_gone
from app.settings import Settings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

GUARDED_PREFIX = "/v1/"
METRICS_PATH = "/metrics"
IMPORT_PATH = re.compile(r"^/v1/pools/[^/]+/nodes/import/?$")
PLACEMENT_PREFIX = "/v1/placement/"
# a JSON string, unrolled so a multi-megabyte string is one linear scan: "[^"\\]*(?:\\.[^"\\]*)*"
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


# method -> [(path regex, grant)], from the route templates of app.api.route_grants
_DECLARED: dict[str, list[tuple[re.Pattern[str], RouteGrant]]] = {}
for (_method, _template), _grant in ROUTE_GRANTS.items():
    _DECLARED.setdefault(_method, []).append((compile_path(_template)[0], _grant))


def route_grant(method: str, path: str) -> tuple[RouteGrant, dict[str, str]] | None:
    """The grant the route of ``method`` and ``path`` declares, with the path parameters, or ``None``.
    A trailing ``/`` is ignored: the router would redirect such a path, after the body was read."""
    if len(path) > 1 and path.endswith("/"):
        path = path[:-1]
    for pattern, grant in _DECLARED.get(method, ()):
        matched = pattern.match(path)
        if matched is not None:
            return grant, matched.groupdict()
    return None


def body_limit(path: str, settings: Settings) -> int:
    """The largest body in bytes that ``path`` accepts (docs/api.md, "Limits")."""
    if IMPORT_PATH.match(path):
        return settings.max_import_body_bytes
    if path.startswith(PLACEMENT_PREFIX):
        return settings.max_placement_body_bytes
    return settings.max_body_bytes


def nesting_exceeds(body: bytes, limit: int) -> bool:
    """True when the JSON text ``body`` nests arrays/objects deeper than ``limit`` levels.

    Brackets inside strings do not count. Works on the raw bytes without parsing (linear time), so a
    body of 1,000 nested arrays is refused before a recursive parser could fail on it."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    depth = 0
    for byte in brackets:
        if byte in b"[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


RECENT_KEY_SECONDS = 300.0  # how long a key that authenticated stays exempt from its address's limit
RECENT_KEYS = 10_000  # keys remembered per process (the least recently authenticated are dropped first)


class RecentKeys:
    """Hashes (SHA-256, never the keys) of keys that authenticated in this process within the last
    ``ttl`` seconds, at most ``size`` of them; ``clock`` gives seconds (monotonic).

    Only an exemption from the failed-authentication limit of an address: a remembered key is still
    looked up on every request, so a revoked key is refused at once and forgotten."""

    def __init__(
        self,
        size: int = RECENT_KEYS,
        ttl: float = RECENT_KEY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._hashes: TTLCache[str, bool] = TTLCache(maxsize=size, ttl=ttl, timer=clock)

    def __contains__(self, key_hash: str) -> bool:
        return key_hash in self._hashes

    def remember(self, key_hash: str) -> None:
        """Note a successful authentication (its ``ttl`` starts again)."""
        self._hashes[key_hash] = True

    def forget(self, key_hash: str) -> None:
        """Drop a key that no longer authenticates (revoked)."""
        self._hashes.pop(key_hash, None)


AGENT_ACTION = "compute:nodes:hello"  # the one action of an agent key (docs/agent.md)


def is_agent_key(principal: Principal) -> bool:
    """True for an agent key: it holds grants, and all of them are ``compute:nodes:hello``."""
    return bool(principal.grants) and all(g.action == AGENT_ACTION for g in principal.grants)


def _bearer_key(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, key = value.decode("latin-1").partition(" ")
            key = key.strip()
            return key if scheme.lower() == "bearer" and key else None
    return None


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class RequestGuard:
    """The ASGI middleware described in this module's docstring; ``settings`` gives its limits."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.rates = RateLimits(
            settings.rate_limit,
            settings.auth_failure_rate_limit,
            settings.agent_rate_limit,
            shared=settings.rate_limit_storage == "postgresql",
        )
        self.recent = RecentKeys()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._guarded(scope["path"]):
            await self.app(scope, receive, send)
            return
        try:
            await self._authenticate(scope)
            self._check_path_and_query(scope)
            self._authorize_route(scope)
            body = await self._read_bounded_body(scope, receive)
        except AppError as refused:
            GUARD_REFUSALS.labels(refused.code).inc()
            response = JSONResponse(refused.to_body(), status_code=refused.status, headers=refused.headers)
            await response(scope, receive, send)
            return
        if body is None:  # the client went away while sending: nothing to answer, logged as 499
            mark_client_gone(scope)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _guarded(self, path: str) -> bool:
        """Every ``/v1/`` path, and ``/metrics`` when ``BC_METRICS_REQUIRE_KEY`` is on (docs/metrics.md)."""
        return path.startswith(GUARDED_PREFIX) or (self.settings.metrics_require_key and path == METRICS_PATH)

    async def _authenticate(self, scope: Scope) -> None:
        client = scope.get("client")
        address = client[0] if client else "unknown"
        services = scope["app"].state.services
        key = _bearer_key(scope)
        if key is None:
            raise await self.rates.failed(
                services.engine,
                address,
                Unauthenticated("an API key is required: Authorization: Bearer <key>"),
            )
        key_hash = hash_key(key)
        if key_hash not in self.recent:  # key guessing: no lookup once the address is over its limit
            self.rates.check_address(address)
        principal = services.keys.get(key_hash)
        if principal is None:
            found = await self._look_up(services, key, key_hash, address)
            principal = found.principal
            services.keys.put(key_hash, principal, found.expires_in)
        self.recent.remember(key_hash)
        state = scope.setdefault("state", {})
        state["principal"] = principal
        state["api_key_id"] = principal.key_id
        await self.rates.spend_key(
            services.engine, principal.key_id or principal.id, agent=is_agent_key(principal)
        )

    async def _look_up(self, services: Any, key: str, key_hash: str, address: str) -> KeyLookup:
        """The principal of ``key`` from the database (one statement, which also notes the key's use at
        most once a minute); an unknown, revoked or expired key counts as a failed authentication of
        ``address``; a database outage is 503."""
        try:
            async with services.engine.connect() as conn:
                # one SELECT: autocommit spares the BEGIN and ROLLBACK round trips on every request
                conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                return await principal_for_key(conn, key, self.settings.bootstrap_admin_key)
        except Unauthenticated as unknown:
            self.recent.forget(key_hash)
            raise await self.rates.failed(services.engine, address, unknown) from None
        except Exception as exc:
            if is_outage(exc):
                raise Unavailable() from exc
            raise

    @staticmethod
    def _authorize_route(scope: Scope) -> None:
        """Step 4 of the module docstring: raise Forbidden when the key cannot hold the route's grant."""
        found = route_grant(scope["method"], scope["path"])
        if found is None:
            return
        grant, params = found
        principal: Principal = scope["state"]["principal"]
        if grant.resource is None:
            if not holds_action(principal, grant.action):
                raise refusal_everywhere(grant.action)
        else:
            authorize(principal, grant.action, grant.resource.format(**params))

    @staticmethod
    def _check_path_and_query(scope: Scope) -> None:
        if "\x00" in scope["path"]:
            raise NotFound("no resource has a NUL character in its name")
        query = scope.get("query_string", b"").decode("latin-1")
        for name, value in parse_qsl(query, keep_blank_values=True):
            found = find_unstorable({name: value})
            if found:
                name = clip_input(found[0])
                raise InvalidInput(f"query parameter {name}: {found[1]}", path=name)

    async def _read_bounded_body(self, scope: Scope, receive: Receive) -> bytes | None:
        limit = body_limit(scope["path"], self.settings)
        too_large = PayloadTooLarge(
            f"the body is larger than this route's limit of {limit} bytes", {"limitBytes": limit}
        )
        declared = _declared_length(scope)
        if declared is not None and declared > limit:
            raise too_large
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # http.disconnect: the client went away
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body and nesting_exceeds(body, self.settings.max_json_depth):
            raise InvalidInput(
                f"the body nests arrays and objects deeper than {self.settings.max_json_depth} levels",
                path="",
            )
        return body
