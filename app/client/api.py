"""An HTTP client of a running better-compute service (the CLI's ``reserve``, ``get``, ``describe`` ...).

:class:`ServiceClient` sends one request per call with ``Authorization: Bearer <key>`` and returns the
decoded JSON answer. Failures are two :class:`~app.errors.AppError` subclasses, so a command handles them
in one place:

- :class:`ServiceError`: the service answered 4xx/5xx; it carries the answer's ``code``, ``message``,
  HTTP ``status`` and ``details`` (``details.path`` names the field of a 422);
- :class:`Unreachable`: no answer at all (refused, unknown host, timeout, a broken connection); its
  message is one line naming the URL, e.g. ``cannot reach http://127.0.0.1:8000: connection refused``.

Lists page (docs/api.md, "HTTP API"): ``?limit=&cursor=`` in, ``{items, nextCursor}`` out.
:meth:`ServiceClient.items` follows ``nextCursor`` until it is absent or null, so it also reads lists that
answer in one page without a cursor.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

from app.errors import AppError

if TYPE_CHECKING:
    from http.client import HTTPConnection

DEFAULT_SERVER = "http://127.0.0.1:8000"
PAGE_SIZE = 500  # items asked per page (every list route accepts at least 1000)
DIRECT_NAME_LOOKUPS = 8  # up to this many nodes are looked up one by one, more by listing their pool


class ServiceError(AppError):
    """An error answer of the service: ``code`` and ``message`` from its ``{"error": {...}}`` body,
    ``status`` the HTTP status, ``details`` the body's details (``{"path": "devices.0.count"}`` on 422)."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, details)
        self.status = status
        self.code = code


class Unreachable(AppError):
    """The service gave no answer: ``message`` is ``cannot reach <url>: <why>`` (one line)."""

    code = "UNREACHABLE"

    def __init__(self, url: str, why: str) -> None:
        super().__init__(f"cannot reach {url}: {why}", {"url": url})
        self.url = url


def _why(error: Exception, timeout: float) -> str:
    """The short cause of a transport failure: the operating system's text (``connection refused``,
    ``name or service not known``) when there is one, else the error's own."""
    if isinstance(error, TimeoutError):
        return f"no answer within {timeout:g} s"
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror.lower()
        cause = cause.__cause__ or cause.__context__
    text = str(error).strip().splitlines()
    return text[-1] if text else type(error).__name__


def _error_from(status: int, reason: str, raw: bytes) -> ServiceError:
    """The :class:`ServiceError` for a 4xx/5xx answer (a body that is not the service's error shape,
    e.g. a proxy's HTML page, becomes ``HTTP_<status>`` with the body's first line)."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        details = error.get("details")
        return ServiceError(
            status, error["code"], str(error.get("message", "")), details if isinstance(details, dict) else {}
        )
    text = raw.decode("utf-8", errors="replace")
    first_line = next(iter(text.strip().splitlines()), reason)
    return ServiceError(status, f"HTTP_{status}", first_line[:200])


class ServiceClient:
    """A client of one service: ``ServiceClient(server, key)`` is a context manager around one
    keep-alive ``http.client`` connection (``timeout`` in seconds per request; lists are read
    ``page_size`` items a request). Every method raises :class:`ServiceError` or :class:`Unreachable`."""

    def __init__(
        self,
        server: str,
        key: str,
        timeout: float = 60.0,
        page_size: int = PAGE_SIZE,
    ) -> None:
        self.server = server.rstrip("/")
        self.timeout = timeout
        self.page_size = page_size
        where = urlsplit(self.server)
        self._https = where.scheme == "https"
        self._host = where.hostname or ""
        self._port = where.port
        self._prefix = where.path
        self._headers = {"Authorization": f"Bearer {key}", "Accept": "application/json"}
        self._connection: HTTPConnection | None = None

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *_: object) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _connect(self) -> HTTPConnection:
        """A new keep-alive connection (the standard library's: the CLI starts faster without httpx)."""
        import http.client

        if self._https:
            import ssl

            context = ssl.create_default_context()
            return http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout, context=context)
        return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)

    def request(
        self, method: str, path: str, params: dict[str, Any] | None = None, body: Any = None
    ) -> tuple[int, Any]:
        """``(status, decoded JSON)`` of one request (``None`` for a 204 without a body); a 4xx/5xx answer
        raises :class:`ServiceError`.
        A kept-alive connection the service closed meanwhile is opened again once (nothing was read
        from it, so the request was not handled)."""
        import http.client

        query = urlencode({k: v for k, v in (params or {}).items() if v is not None})
        target = quote(self._prefix + path, safe="/:@%") + (f"?{query}" if query else "")
        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = dict(self._headers)
        if data is not None:
            headers["Content-Type"] = "application/json"
        for attempt in (1, 2):
            reused = self._connection is not None
            connection = self._connection or self._connect()
            self._connection = connection
            try:
                connection.request(method, target, body=data, headers=headers)
                response = connection.getresponse()
                raw = response.read()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as error:
                connection.close()
                self._connection = None
                if not reused or attempt == 2:
                    raise Unreachable(self.server, _why(error, self.timeout)) from None
            except (OSError, http.client.HTTPException) as error:
                connection.close()
                self._connection = None
                raise Unreachable(self.server, _why(error, self.timeout)) from None
        if response.status >= 400:
            raise _error_from(response.status, response.reason, raw)
        if response.status == 204:
            return 204, None
        try:
            return response.status, json.loads(raw)
        except ValueError:
            raise ServiceError(
                response.status, "BAD_ANSWER", f"{method} {path} answered something other than JSON"
            ) from None

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """The decoded answer of ``GET path``."""
        return self.request("GET", path, params)[1]

    def items(self, path: str, params: dict[str, Any] | None = None, limit: int | None = None) -> list[Any]:
        """Every item of a list route (at most ``limit``), following ``nextCursor`` page by page."""
        return list(self._pages(path, dict(params or {}), limit))

    def _pages(self, path: str, params: dict[str, Any], limit: int | None) -> Iterator[Any]:
        seen = 0
        position: dict[str, Any] = {}
        while True:
            page_size = self.page_size if limit is None else min(self.page_size, limit - seen)
            answer = self.get(path, {**params, **position, "limit": page_size})
            for item in answer.get("items", []):
                yield item
                seen += 1
                if limit is not None and seen >= limit:
                    return
            if not answer.get("nextCursor"):
                return
            position = {"cursor": answer["nextCursor"]}

    # -- the service's operations ------------------------------------------------------------------

    def preview(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/capacity/preview``: ``{fits, candidates: [{nodeId, nodeName, atoms, score,
        scores}], reason?}``."""
        return self.request("POST", "/v1/capacity/preview", body=body)[1]

    def reserve(self, body: dict[str, Any], wait_seconds: int = 30) -> dict[str, Any]:
        """``POST /v1/reservations``: the reservation (placed, pending or queued; an idempotent retry
        answers the same one). A ``queued`` one (the pool-lease placer) is waited for with
        ``GET /v1/reservations/{id}?waitSeconds=<wait_seconds>`` (0..30; 0: not waited for), so the
        answer is the batch worker's decision; it stays ``queued`` when the key may not read it or
        the wait ran out."""
        reservation = self.request("POST", "/v1/reservations", body=body)[1]
        if reservation.get("status") == "queued" and wait_seconds > 0:
            params = {"waitSeconds": min(wait_seconds, 30)}
            path = f"/v1/reservations/{reservation['id']}"
            decided = _readable(lambda: self.get(path, params))
            if decided is not None:
                return decided
        return reservation

    def release(self, reservation_id: str) -> dict[str, Any]:
        """``POST /v1/reservations/{id}/release``: the released reservation."""
        return self.request("POST", f"/v1/reservations/{reservation_id}/release")[1]

    def reservation(self, reservation_id: str) -> dict[str, Any]:
        """``GET /v1/reservations/{id}``."""
        return self.get(f"/v1/reservations/{reservation_id}")

    def reservations(
        self, tenant: str | None = None, status: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """``GET /v1/reservations?tenantId=&status=``, newest first, every page (at most ``limit``)."""
        return self.items("/v1/reservations", {"tenantId": tenant, "status": status}, limit)

    def pools(self, limit: int | None = None) -> list[dict[str, Any]]:
        """``GET /v1/pools``: the pools this key may see."""
        return self.items("/v1/pools", limit=limit)

    def pool(self, pool_id: str) -> dict[str, Any]:
        """``GET /v1/pools/{id}``."""
        return self.get(f"/v1/pools/{pool_id}")

    def pool_name(self, pool_id: str) -> str | None:
        """The pool's name, or None when this key may not read the pool (403) or it is gone (404)."""
        pool = _readable(lambda: self.pool(pool_id))
        return None if pool is None else pool["name"]

    def nodes(self, pool_id: str, limit: int | None = None) -> list[dict[str, Any]]:
        """``GET /v1/pools/{id}/nodes``: node summaries (``devices`` is ``{class: count}``), id order."""
        return self.items(f"/v1/pools/{pool_id}/nodes", limit=limit)

    def node(self, node_id: str) -> dict[str, Any]:
        """``GET /v1/nodes/{id}``: the whole node (devices, links, resources)."""
        return self.get(f"/v1/nodes/{node_id}")

    def drain_node(self, node_id: str, reschedule: bool) -> dict[str, Any]:
        """``POST /v1/nodes/{id}/drain`` ``{reschedule}``: the node with the reservations it moved."""
        return self.request("POST", f"/v1/nodes/{node_id}/drain", body={"reschedule": reschedule})[1]

    def undrain_node(self, node_id: str) -> dict[str, Any]:
        """``POST /v1/nodes/{id}/undrain``: the node."""
        return self.request("POST", f"/v1/nodes/{node_id}/undrain")[1]

    def delete_node(self, node_id: str) -> None:
        """``DELETE /v1/nodes/{id}`` (204; 409 CONFLICT while it holds current or future work)."""
        self.request("DELETE", f"/v1/nodes/{node_id}")

    def node_names(self, pool_node_ids: dict[str, set[str]]) -> dict[str, str]:
        """``{node id: name}`` for the given ``{pool id: node ids}``. A few nodes are read one by one,
        more by listing their pool; a node the key may not read (403, 404) keeps its id as its name, so
        a tenant key without inventory grants still gets its output."""
        names: dict[str, str] = {}
        for pool_id, node_ids in pool_node_ids.items():
            if len(node_ids) > DIRECT_NAME_LOOKUPS:
                pool_nodes = _readable(lambda pool_id=pool_id: self.nodes(pool_id)) or []
                names.update({n["id"]: n["name"] for n in pool_nodes if n["id"] in node_ids})
            else:
                for node_id in sorted(node_ids):
                    node = _readable(lambda node_id=node_id: self.node(node_id))
                    if node is not None:
                        names[node_id] = node["name"]
        return names

    def held_node_names(self, tenant_id: str, pool_id: str, start: str, end: str) -> dict[str, str]:
        """``{node id: name}`` of the nodes that held work of the tenant in the pool over ``[start,
        end)`` (``GET /v1/usage?groupBy=node``): deleted nodes too, which every node route answers 404
        for (docs/operating.md, "Maintenance: drain and delete"); ``{}`` when the key may not read it."""
        params = {"tenantId": tenant_id, "poolId": pool_id, "from": start, "to": end, "groupBy": "node"}
        answer = _readable(lambda: self.get("/v1/usage", params))
        return {
            row["nodeId"]: row["nodeName"] for row in (answer or {}).get("rows", []) if row.get("nodeName")
        }

    # -- operators: pools, nodes, quotas (docs/api.md, "Inventory"; docs/quota.md) ----------------------

    def create_pool(self, name: str) -> dict[str, Any]:
        """``POST /v1/pools {name}``: the new pool."""
        return self.request("POST", "/v1/pools", body={"name": name})[1]

    def archive_pool(self, pool_id: str) -> dict[str, Any]:
        """``POST /v1/pools/{id}/archive``: the archived pool (archiving twice answers it again)."""
        return self.request("POST", f"/v1/pools/{pool_id}/archive")[1]

    def import_node(self, pool_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/pools/{id}/nodes/import {name, topo, nvidiaSmiXml?, labels?, ...}``: the node
        made, with ``warnings`` for topo cells it left out."""
        return self.request("POST", f"/v1/pools/{pool_id}/nodes/import", body=body)[1]

    def set_node_labels(self, node_id: str, labels: dict[str, str]) -> dict[str, Any]:
        """``PUT /v1/nodes/{id}/labels``: replaces the node's operator labels (system labels stay)."""
        return self.request("PUT", f"/v1/nodes/{node_id}/labels", body={"labels": labels})[1]

    def set_node_taints(self, node_id: str, taints: list[dict[str, Any]]) -> dict[str, Any]:
        """``PUT /v1/nodes/{id}/taints``: replaces the node's whole taint list."""
        return self.request("PUT", f"/v1/nodes/{node_id}/taints", body={"taints": taints})[1]

    def cordon(self, node_id: str, cordoned: bool = True) -> dict[str, Any]:
        """``POST /v1/nodes/{id}/cordon`` (or ``uncordon``): the node."""
        return self.request("POST", f"/v1/nodes/{node_id}/{'cordon' if cordoned else 'uncordon'}")[1]

    def quota(self, tenant: str, pool_id: str) -> dict[str, Any]:
        """``GET /v1/tenants/{tenant}/quotas/{pool}``: ``{limits, used, peak, peakWindow}``."""
        return self.get(f"/v1/tenants/{tenant}/quotas/{pool_id}")

    def set_quota(self, tenant: str, pool_id: str, limits: dict[str, Any]) -> dict[str, Any]:
        """``PUT /v1/tenants/{tenant}/quotas/{pool}``: replaces the tenant's limits in the pool; the
        answer's ``warnings`` name each limit the write dropped."""
        return self.request("PUT", f"/v1/tenants/{tenant}/quotas/{pool_id}", body={"limits": limits})[1]

    # -- names for ids ------------------------------------------------------------------------------

    def pool_id(self, ref: str) -> str:
        """The id of the pool ``ref`` names: a ``pool_...`` id as it is, else the visible pool of that
        name. Raises :class:`ServiceError` ``NOT_FOUND`` when no visible pool has the name."""
        if ref.startswith("pool_"):
            return ref
        for pool in self.pools():
            if pool["name"] == ref:
                return str(pool["id"])
        raise ServiceError(404, "NOT_FOUND", f"pool '{ref}' not found (no visible pool has that name)")

    def node_id(self, ref: str, pool: str | None = None) -> str:
        """The id of the node ``ref`` names: a ``node_...`` id as it is, else the node of that name in
        ``pool`` (name or id), or in any visible pool. Raises :class:`ServiceError` ``NOT_FOUND`` for
        no such node, ``CONFLICT`` when pools share the name (give ``--pool``)."""
        if ref.startswith("node_"):
            return ref
        pool_ids = [self.pool_id(pool)] if pool else [p["id"] for p in self.pools()]
        found = [n["id"] for p in pool_ids for n in self.nodes(p) if n["name"] == ref]
        if not found:
            raise ServiceError(404, "NOT_FOUND", f"node '{ref}' not found (no visible node has that name)")
        if len(found) > 1:
            raise ServiceError(409, "CONFLICT", f"{len(found)} pools have a node '{ref}': give --pool")
        return str(found[0])

    def named_pool(self, ref: str) -> dict[str, Any]:
        """The pool ``ref`` names, by id or name (:meth:`pool_id`)."""
        return self.pool(self.pool_id(ref))

    def named_node(self, ref: str, pool: str | None = None) -> dict[str, Any]:
        """The whole node ``ref`` names, by id or name (:meth:`node_id`; ``pool`` picks among pools)."""
        return self.node(self.node_id(ref, pool))


def _readable(read: Callable[[], Any]) -> Any:
    """``read()``, or None when the key may not read it (403) or it is gone (404)."""
    try:
        return read()
    except ServiceError as error:
        if error.status in (403, 404):
            return None
        raise
