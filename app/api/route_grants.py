"""The action each route that takes a body needs, known before the body is read (docs/api.md,
"Limits").

The request guard (:mod:`app.api.guard`) refuses a key that cannot hold the route's grant with 403 before
it reads a byte of the body, so a key without the grant cannot make the service read, buffer and parse
up to 24 MiB per request (an import) only to be refused afterwards. Each route still authorizes itself
with :func:`app.iam.authorize.authorize`; the guard's check is a necessary condition of the route's:

- ``resource`` is a template filled from the path (``pool:{pool_id}``) or ``*``: the guard checks the
  grant on it, as the route does (the same 403);
- ``resource`` ``None``: the resource depends on the body (``poolId``, ``tenantId``) or on a row (a
  node's pool): the guard refuses only a key that holds the action on no resource at all.

Routes left out, and why, are in :data:`NOT_DECLARED`; a test checks that every route that takes a body
is in one of the two tables and that each action here is the one its route authorizes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RouteGrant:
    """``action`` on ``resource`` (a template over the path parameters; ``None``: on some resource)."""

    action: str
    resource: str | None = None


INVENTORY_WRITE = "compute:inventory:write"
EXPLAIN = "compute:placement:explain"

ROUTE_GRANTS: dict[tuple[str, str], RouteGrant] = {
    ("POST", "/v1/api-keys"): RouteGrant("compute:iam:admin"),
    ("POST", "/v1/pools"): RouteGrant(INVENTORY_WRITE, "*"),
    ("POST", "/v1/pools/{pool_id}/archive"): RouteGrant(INVENTORY_WRITE, "pool:{pool_id}"),
    ("POST", "/v1/pools/{pool_id}/nodes"): RouteGrant(INVENTORY_WRITE, "pool:{pool_id}"),
    ("POST", "/v1/pools/{pool_id}/nodes/import"): RouteGrant(INVENTORY_WRITE, "pool:{pool_id}"),
    ("POST", "/v1/nodes/{node_id}/cordon"): RouteGrant(INVENTORY_WRITE),
    ("POST", "/v1/nodes/{node_id}/uncordon"): RouteGrant(INVENTORY_WRITE),
    ("POST", "/v1/nodes/{node_id}/drain"): RouteGrant(INVENTORY_WRITE),
    ("POST", "/v1/nodes/{node_id}/undrain"): RouteGrant(INVENTORY_WRITE),
    ("DELETE", "/v1/nodes/{node_id}"): RouteGrant(INVENTORY_WRITE),
    ("PUT", "/v1/nodes/{node_id}/taints"): RouteGrant(INVENTORY_WRITE),
    ("PUT", "/v1/nodes/{node_id}/labels"): RouteGrant(INVENTORY_WRITE),
    ("POST", "/v1/nodes/{node_id}/health"): RouteGrant(INVENTORY_WRITE),
    ("PUT", "/v1/tenants/{tenant_id}/quotas/{pool_id}"): RouteGrant("compute:quota:write", "pool:{pool_id}"),
    ("POST", "/v1/capacity/preview"): RouteGrant("compute:capacity:read"),
    ("POST", "/v1/reservations"): RouteGrant("compute:reservations:create"),
    ("POST", "/v1/reservations/{reservation_id}/release"): RouteGrant("compute:reservations:release"),
    ("POST", "/v1/reservations/{reservation_id}/extend"): RouteGrant("compute:reservations:release"),
    ("POST", "/v1/nodes/hello"): RouteGrant("compute:nodes:hello"),
    ("POST", "/v1/nodes/{node_id}/heartbeat"): RouteGrant("compute:nodes:hello"),
    ("POST", "/v1/placement/explain"): RouteGrant(EXPLAIN, "*"),
    ("POST", "/v1/placement/fleet"): RouteGrant(EXPLAIN, "*"),
    ("POST", "/v1/placement/compare"): RouteGrant(EXPLAIN, "*"),
    ("PUT", "/v1/placement/jobs/{job_id}"): RouteGrant(INVENTORY_WRITE, "*"),
}

NOT_DECLARED: dict[tuple[str, str], str] = {
    ("POST", "/v1/reservations/batch"): "each item is authorized alone; the call answers 200 for any key",
    ("DELETE", "/v1/api-keys/{key_id}"): "no body",
    ("PUT", "/v1/reservations/batch"): "405: only POST creates a batch",
    ("PATCH", "/v1/reservations/batch"): "405: only POST creates a batch",
    ("DELETE", "/v1/reservations/batch"): "405: only POST creates a batch",
}
